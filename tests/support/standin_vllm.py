"""A vLLM server's stand-in for the real-systemd tier: what cannot run here is the GPU, so this program
holds an exclusive lock in its place (`$EAGLE3_TEST_GPU`, flock) from its start until its LAST
process exits, and exits 1 at start when another server holds it, as vLLM does when the GPUs' memory
is taken. Like vLLM it binds its port early, answers /health 503 while it "loads", has a worker
process (vLLM's engine core) that outlives the main process by a moment on SIGTERM, and takes a
moment to stop. Every start, refusal and exit is appended to `$EAGLE3_TEST_EVENTS` as a JSON line
(time, pid, systemd's $INVOCATION_ID, argv, whether it is the draft, and a sha256 of HF_TOKEN: the
tests compare environments without a secret in any file). With `--speculative-config` (the draft)
it exits 1 at once while `draft-crashes` exists beside the events file; without it, the same with
`production-crashes`. It answers /health and /v1/models only (404 otherwise: no /metrics).

Run by /usr/bin/python3 with no dependency: units run it as other users (User=nobody).
"""

import fcntl
import hashlib
import http.server
import json
import os
import signal
import sys
import threading
import time

LOAD_S, STOP_S, WORKER_LINGER_S = 0.3, 0.5, 0.8
ARGS = sys.argv[1:]
EVENTS = os.environ["EAGLE3_TEST_EVENTS"]
DRAFT = "--speculative-config" in ARGS


def event(kind: str, **extra: object) -> None:
    token = os.environ.get("HF_TOKEN")
    line = {
        "t": time.time(), "event": kind, "pid": os.getpid(), "invocation": os.environ.get("INVOCATION_ID"),
        "draft": DRAFT, "argv": ARGS, "hf_token_sha256": token and hashlib.sha256(token.encode()).hexdigest(),
        "uid": os.getuid(), **extra,
    }  # fmt: skip
    with open(EVENTS, "a") as f:
        f.write(json.dumps(line) + "\n")


def flag(name: str) -> bool:
    return os.path.exists(os.path.join(os.path.dirname(EVENTS), name))


def option(name: str, default: str) -> str:
    return ARGS[ARGS.index(name) + 1] if name in ARGS else default


gpu = os.open(os.environ["EAGLE3_TEST_GPU"], os.O_RDWR)
try:
    fcntl.flock(gpu, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    event("gpu-busy")
    sys.exit("torch.OutOfMemoryError: CUDA out of memory (the GPU stand-in is held by another server)")
if flag("draft-crashes" if DRAFT else "production-crashes"):
    event("crash")
    sys.exit("RuntimeError: CUDA error: an illegal memory access was encountered (scripted)")
event("start")
if os.fork() == 0:  # the engine core: holds the GPU (the inherited lock) until it exits
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(WORKER_LINGER_S), os._exit(0)))
    while True:
        time.sleep(1)

ready = threading.Event()
model = option("--served-model-name", option("serve", "model"))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not ready.is_set():
            self.send_response(503)
            self.end_headers()
            return
        if self.path not in ("/health", "/v1/models"):
            self.send_response(404)
            self.end_headers()
            return
        body = b"" if self.path == "/health" else json.dumps({"data": [{"id": model}]}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def stop(*_: object) -> None:
    time.sleep(STOP_S)
    event("exit")
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(option("--port", "8000"))), Handler)
threading.Timer(LOAD_S, ready.set).start()
server.serve_forever()
