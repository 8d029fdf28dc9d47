"""Generation throughput: the pipeline's client beside plain clients and raw capacity.

(a) Against a vLLM server (`--base-url`, or `--model DIR` to start the demo target on a free port):
    the pipeline's run_generation (journal, slots, progress included), a plain sequential `requests`
    client, and raw capacity (the same number of concurrent bare requests, nothing parsed or stored).
(b) Client overhead against a local endpoint that answers instantly with a canned vLLM-shaped reply
    (256 completion token ids): requests/s and client CPU microseconds per request, beside a plain
    sequential `requests` client. The endpoint runs in its own process; both share this machine's cores.
(c) `--shard-jobs N`: the pipeline as Snakemake runs it, N shard jobs in parallel processes sharing the
    global cap (journals included), beside a plain threaded `requests` client with as many threads as
    the cap, on the same server and prompts count; rounds alternate, each on fresh prompts. The span
    is first request to last reply (for the jobs: from the earliest job's first send to the last
    job's end, process start-up excluded as Snakemake's is).
(d) `--replicas N` (with `--shard-jobs`): the same shard jobs against N vLLM servers of the same model
    (shard k to server k mod N, each server its own slot folder and cap, as server.replicas runs
    them) beside all of them against one server; rounds alternate, each on fresh prompts.

Prints one JSON line per measurement. Examples:
    .venv/bin/python benchmarks/generation.py --instant-only
    .venv/bin/python benchmarks/generation.py --model resources/demo/target --requests 64 --max-tokens 64
    .venv/bin/python benchmarks/generation.py --model resources/demo/target --shard-jobs 4 \
        --requests 256 --max-tokens 128 --concurrency 64
    .venv/bin/python benchmarks/generation.py --model resources/demo/target --shard-jobs 4 --replicas 2 \
        --requests 256 --max-tokens 128 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import requests

from eagle3_pipeline.generate.http import Http
from eagle3_pipeline.generate.payload import Sampling, chat_body
from eagle3_pipeline.generate.shard import run_generation
from eagle3_pipeline.ports import free_port
from eagle3_pipeline.prompts import PROMPT_SCHEMA
from eagle3_pipeline.settings import GenerationSettings

REPO = Path(__file__).resolve().parent.parent


def emit(**record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


# --- the instant endpoint (runs in a child process) -------------------------------------------------


def canned_body(tokens: int = 256) -> bytes:
    message = {"role": "assistant", "content": "The answer is 42. " * 8, "reasoning": "Let me think. " * 40}
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "model": "bench",
            "prompt_token_ids": list(range(100, 164)),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "stop",
                    "token_ids": list(range(200, 200 + tokens)),
                }
            ],
            "usage": {"prompt_tokens": 64, "completion_tokens": tokens, "total_tokens": 64 + tokens},
        }
    ).encode()


class _Instant(asyncio.Protocol):
    response = b""
    delay_s = 0.0

    def connection_made(self, transport) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            length = (
                int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0 else None])
                if at >= 0
                else 0
            )
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            if self.delay_s:  # a server with a fixed latency and no limit on parallel requests
                asyncio.get_running_loop().call_later(self.delay_s, self.transport.write, self.response)
            else:
                self.transport.write(self.response)


def serve_instant(port: int, delay_s: float = 0.0) -> None:
    _Instant.delay_s = delay_s
    body = canned_body()
    _Instant.response = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (
            len(body),
            body,
        )
    )
    loop = asyncio.new_event_loop()
    loop.run_until_complete(loop.create_server(_Instant, "127.0.0.1", port, backlog=1024))
    loop.run_forever()


# --- clients ----------------------------------------------------------------------------------------


def prompt_frame(n: int, questions: list[str] | None = None, offset: int = 0) -> pl.DataFrame:
    """n distinct questions (offset gives each measurement its own, so no prefix-cache hits carry over)."""
    questions = questions or [f"What is {i} + {i + 1}?" for i in range(offset, offset + n)]
    questions = [questions[i % len(questions)] + ("" if i < len(questions) else f" ({i})") for i in range(n)]
    return pl.DataFrame(
        {
            "id": [f"b{i:06d}" for i in range(n)],
            "source": ["bench"] * n,
            "row": list(range(n)),
            "turn": [0] * n,
            "system": [None] * n,
            "question": questions,
            "original_answer": [None] * n,
        },
        schema=PROMPT_SCHEMA,
    )


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_pipeline(base_url: str, sampling: Sampling, frame: pl.DataFrame, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        generation = GenerationSettings(
            concurrency=concurrency, global_concurrency=concurrency, retries=2, request_timeout_s=600
        )
        cpu, start = cpu_seconds(), time.perf_counter()
        out = run_generation(frame, base_url, sampling, generation, Path(tmp) / "j.jsonl", identity="bench")
        wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    tokens = int(out["completion_tokens"].sum() or 0)
    ok = int((out["status"] == "ok").sum())
    return {
        "requests": len(out),
        "ok": ok,
        "wall_s": round(wall, 3),
        "req_per_s": round(len(out) / wall, 3),
        "tok_per_s": round(tokens / wall, 2),
        "client_cpu_us_per_req": round(cpu / len(out) * 1e6, 1),
    }


def bench_sequential(base_url: str, sampling: Sampling, frame: pl.DataFrame) -> dict:
    session, tokens = requests.Session(), 0
    cpu, start = cpu_seconds(), time.perf_counter()
    for record in frame.to_dicts():
        response = session.post(
            f"{base_url}/v1/chat/completions",
            data=chat_body(record, sampling),
            headers={"Content-Type": "application/json"},
            timeout=600,
        )
        response.raise_for_status()
        tokens += len(response.json()["choices"][0]["token_ids"])
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    n = len(frame)
    return {
        "requests": n,
        "wall_s": round(wall, 3),
        "req_per_s": round(n / wall, 3),
        "tok_per_s": round(tokens / wall, 2),
        "client_cpu_us_per_req": round(cpu / n * 1e6, 1),
    }


async def _raw(base_url: str, bodies: list[bytes], concurrency: int) -> int:
    http, queue, tokens = Http(base_url, {}, concurrency), list(reversed(bodies)), 0

    async def worker() -> None:
        nonlocal tokens
        while queue:
            response = await http.request("POST", "/v1/chat/completions", queue.pop(), 600)
            start = response.body.find(b'"token_ids":[')  # the choice's ids (not prompt_token_ids)
            tokens += response.body.count(b",", start, response.body.find(b"]", start)) + 1

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await http.close()
    return tokens


def bench_raw(base_url: str, sampling: Sampling, frame: pl.DataFrame, concurrency: int) -> dict:
    bodies = [chat_body(record, sampling) for record in frame.to_dicts()]
    start = time.perf_counter()
    tokens = asyncio.run(_raw(base_url, bodies, concurrency))
    wall = time.perf_counter() - start
    return {
        "requests": len(bodies),
        "wall_s": round(wall, 3),
        "req_per_s": round(len(bodies) / wall, 3),
        "tok_per_s": round(tokens / wall, 2),
    }


SHARD_JOB = """
import json, resource, sys, time
import polars as pl
try:
    from eagle3_pipeline.generate.payload import Sampling
except ImportError:  # a checkout from before payload.py (--compare-pythonpath)
    from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.generate.shard import run_generation
a = json.loads(sys.argv[1])
try:  # typed sections (a checkout from before them takes the dict: --compare-pythonpath)
    from eagle3_pipeline.settings import GenerationSettings, section
    a["gen"] = section(GenerationSettings, a["gen"])
except ImportError:
    pass
frame = pl.read_parquet(a["prompts"])
start = time.time()
out = run_generation(frame, a["url"], Sampling(**a["sampling"]), a["gen"], a["journal"], "bench",
                     shard=a["shard"], slots_dir=a["slots"])
end = time.time()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"start": start, "end": end, "tokens": int(out["completion_tokens"].sum() or 0),
                  "ok": int((out["status"] == "ok").sum()), "cpu": usage.ru_utime + usage.ru_stime}))
"""


def bench_shard_jobs(
    base_url: str | list[str],
    sampling: Sampling,
    frame: pl.DataFrame,
    jobs: int,
    cap: int,
    pythonpath: str | None = None,
) -> dict:
    """N shard jobs as parallel processes sharing the global cap; the span from first send to last end.

    `base_url`: one server, or a list of replicas (job k sends to server k mod n, each server with its
    own slot folder: the cap is per server). `pythonpath` runs the jobs on another checkout's package
    (its src/), e.g. the previous client.
    """
    urls = [base_url] if isinstance(base_url, str) else base_url
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    with tempfile.TemporaryDirectory() as tmp:
        gen = {"concurrency": cap, "global_concurrency": cap, "retries": 2, "request_timeout_s": 600}
        size = -(-len(frame) // jobs)
        children = []
        for k in range(jobs):
            path = Path(tmp) / f"p{k}.parquet"
            frame.slice(k * size, size).write_parquet(path)
            args = {
                "prompts": str(path),
                "url": urls[k % len(urls)],
                "sampling": {
                    k: getattr(sampling, k) for k in ("model", "max_tokens", "temperature", "top_p", "seed")
                },
                "gen": gen,
                "journal": f"{tmp}/j{k}.jsonl",
                "slots": f"{tmp}/slots-{k % len(urls)}",
                "shard": k,
            }
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", SHARD_JOB, json.dumps(args)],
                    stdout=subprocess.PIPE,
                    stderr=open(f"{tmp}/err{k}.log", "w"),  # noqa: SIM115 - closed with the folder
                    text=True,
                    env=env,
                )
            )
        results = []
        for k, child in enumerate(children):
            lines = child.communicate()[0].splitlines()
            if child.returncode or not lines:
                tail = Path(f"{tmp}/err{k}.log").read_text()[-3000:]
                raise RuntimeError(f"shard job {k} failed ({child.returncode}):\n{tail}")
            results.append(json.loads(lines[-1]))
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    return {
        "requests": len(frame),
        "ok": sum(r["ok"] for r in results),
        "jobs": jobs,
        "servers": len(urls),
        "span_s": round(span, 3),
        "req_per_s": round(len(frame) / span, 3),
        "tok_per_s": round(tokens / span, 2),
        "client_cpu_s": round(sum(r["cpu"] for r in results), 2),
    }


def bench_threaded(base_url: str, sampling: Sampling, frame: pl.DataFrame, threads: int) -> dict:
    """A plain threaded client: `threads` threads, a requests.Session each, nothing stored."""
    local, tokens, lock = threading.local(), [0], threading.Lock()
    bodies = [chat_body(record, sampling) for record in frame.to_dicts()]

    def send(body: bytes) -> None:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        response = local.session.post(
            f"{base_url}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=600,
        )
        response.raise_for_status()
        with lock:
            tokens[0] += len(response.json()["choices"][0]["token_ids"])

    cpu, start = cpu_seconds(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(send, bodies))
    span, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    return {
        "requests": len(bodies),
        "threads": threads,
        "span_s": round(span, 3),
        "req_per_s": round(len(bodies) / span, 3),
        "tok_per_s": round(tokens[0] / span, 2),
        "client_cpu_s": round(cpu, 2),
    }


def part_shard_jobs(
    base_url: str,
    model_name: str,
    requests_n: int,
    jobs: int,
    concurrency: int,
    max_tokens: int,
    rounds: int,
    compare_pythonpath: str | None = None,
) -> None:
    sampling = Sampling(model_name, max_tokens, 0.6, 0.95, None)
    bench_raw(base_url, sampling, prompt_frame(8, offset=10**6), 8)  # warm-up
    clients = {"pipeline": None, "threaded_requests": None}
    if compare_pythonpath:
        clients["pipeline_compared"] = compare_pythonpath
    spans: dict[str, list[float]] = {name: [] for name in clients}
    offset = 10
    for round_ in range(rounds):  # alternate, so that no client gets the quieter moment
        for name, pythonpath in clients.items():
            frame = prompt_frame(requests_n, offset=offset * requests_n)  # fresh prompts: no cache hits
            offset += 1
            if name == "threaded_requests":
                result = bench_threaded(base_url, sampling, frame, concurrency)
            else:
                result = bench_shard_jobs(base_url, sampling, frame, jobs, concurrency, pythonpath)
            emit(bench="vllm_shard_jobs", client=name, round=round_, max_tokens=max_tokens,
                 load_average_1m=os.getloadavg()[0], **result)  # fmt: skip
            spans[name].append(result["span_s"])
    for name in clients:
        if name != "threaded_requests":
            emit(
                bench="vllm_shard_jobs",
                ratio=f"threaded_span_over_{name}_span",
                value=round(sum(spans["threaded_requests"]) / sum(spans[name]), 3),
                per_round=[
                    round(t / p, 3) for t, p in zip(spans["threaded_requests"], spans[name], strict=True)
                ],
            )


def part_replicas(
    base_urls: list[str],
    model_name: str,
    requests_n: int,
    jobs: int,
    concurrency: int,
    max_tokens: int,
    rounds: int,
) -> None:
    """The shard jobs against every replica (k mod n) beside all of them against the first one."""
    sampling = Sampling(model_name, max_tokens, 0.6, 0.95, None)
    for url in base_urls:
        bench_raw(url, sampling, prompt_frame(8, offset=10**6), 8)  # warm-up
    layouts = {"one_server": base_urls[:1], f"{len(base_urls)}_replicas": base_urls}
    spans: dict[str, list[float]] = {name: [] for name in layouts}
    offset = 10
    for round_ in range(rounds):  # alternate, so that neither layout gets the quieter moment
        for name, urls in layouts.items():
            frame = prompt_frame(requests_n, offset=offset * requests_n)  # fresh prompts: no cache hits
            offset += 1
            result = bench_shard_jobs(urls, sampling, frame, jobs, concurrency)
            emit(bench="vllm_replicas", layout=name, round=round_, max_tokens=max_tokens,
                 load_average_1m=os.getloadavg()[0], **result)  # fmt: skip
            spans[name].append(result["span_s"])
    one, many = spans["one_server"], spans[f"{len(base_urls)}_replicas"]
    emit(
        bench="vllm_replicas",
        ratio="one_server_span_over_replicas_span",
        value=round(sum(one) / sum(many), 3),
        per_round=[round(a / b, 3) for a, b in zip(one, many, strict=True)],
    )


# --- the two parts ---------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_instant(delay_s: float = 0.0) -> tuple[subprocess.Popen, str]:
    """The canned endpoint in a child process (answering after delay_s); its process and base URL."""
    port = free_port()
    argv = [sys.executable, __file__, "--serve-instant", str(port), "--endpoint-delay-s", str(delay_s)]
    server = subprocess.Popen(argv, start_new_session=True)  # its own group, as vLLM's: killpg is safe
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.1)
    return server, f"http://127.0.0.1:{port}"


def part_instant(requests_n: int, concurrency: int) -> None:
    server, base_url = start_instant()
    try:
        sampling = Sampling("bench", 256, 0.6, 0.95, 0)
        frame = prompt_frame(requests_n)
        endpoint_cpu = process_cpu_seconds(server.pid)
        pipeline = bench_pipeline(base_url, sampling, frame, concurrency)
        endpoint_cpu = (process_cpu_seconds(server.pid) - endpoint_cpu) / requests_n * 1e6
        emit(
            bench="instant_endpoint",
            client="pipeline",
            concurrency=concurrency,
            endpoint_cpu_us_per_req=round(endpoint_cpu, 1),
            load_average_1m=os.getloadavg()[0],
            **pipeline,
        )
        sequential = bench_sequential(base_url, sampling, prompt_frame(min(requests_n, 2000)))
        emit(bench="instant_endpoint", client="sequential_requests", **sequential)
        emit(
            bench="instant_endpoint",
            ratio="pipeline_over_sequential_req_per_s",
            value=round(pipeline["req_per_s"] / sequential["req_per_s"], 2),
        )
    finally:
        server.terminate()
        server.wait()


def start_vllm(model: str, max_model_len: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
    )
    argv = [
        str(REPO / ".venv-vllm/bin/python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        "bench",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--reasoning-parser",
        "kimi_k2",
        "--dtype",
        "bfloat16",
        "--enforce-eager",
    ]
    log_file = open(Path(tempfile.gettempdir()) / f"bench-vllm-{port}.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
    )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited; see {log_file.name}")
        try:
            if requests.get(f"{base_url}/health", timeout=2).status_code == 200:
                return process, base_url
        except requests.RequestException:
            pass
        time.sleep(2)
    raise RuntimeError(f"vLLM not healthy in 600 s; see {log_file.name}")


def part_server(
    base_url: str, model_name: str, requests_n: int, sequential_n: int, concurrency: int, max_tokens: int
) -> None:
    sampling = Sampling(model_name, max_tokens, 0.6, 0.95, 0)
    bench_raw(base_url, sampling, prompt_frame(8, offset=10**6), 8)  # warm-up
    raws, pipelines = [], []
    for round_ in range(2):  # alternate, so that neither side gets the quieter moment or a warmer server
        raw = bench_raw(
            base_url, sampling, prompt_frame(requests_n, offset=(2 * round_) * requests_n), concurrency
        )
        emit(
            bench="vllm_server",
            client="raw_concurrent",
            round=round_,
            concurrency=concurrency,
            max_tokens=max_tokens,
            **raw,
        )
        frame = prompt_frame(requests_n, offset=(2 * round_ + 1) * requests_n)
        pipeline = bench_pipeline(base_url, sampling, frame, concurrency)
        emit(
            bench="vllm_server",
            client="pipeline",
            round=round_,
            concurrency=concurrency,
            max_tokens=max_tokens,
            **pipeline,
        )
        raws.append(raw["req_per_s"])
        pipelines.append(pipeline["req_per_s"])
    raw, pipeline = {"req_per_s": sum(raws) / 2}, {"req_per_s": sum(pipelines) / 2}
    sequential = bench_sequential(base_url, sampling, prompt_frame(sequential_n, offset=4 * requests_n))
    emit(bench="vllm_server", client="sequential_requests", max_tokens=max_tokens, **sequential)
    emit(
        bench="vllm_server",
        ratio="pipeline_over_raw_req_per_s",
        value=round(pipeline["req_per_s"] / raw["req_per_s"], 3),
    )
    emit(
        bench="vllm_server",
        ratio="pipeline_over_sequential_req_per_s",
        value=round(pipeline["req_per_s"] / sequential["req_per_s"], 2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve-instant", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--instant-only", action="store_true", help="only part (b)")
    parser.add_argument("--instant-requests", type=int, default=20000)
    parser.add_argument("--base-url", help="an running vLLM server for part (a)")
    parser.add_argument("--served-model-name", default="bench")
    parser.add_argument("--model", help="start vLLM on this model for part (a) (e.g. resources/demo/target)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--sequential-requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--shard-jobs", type=int, help="part (c) only, with this many parallel shard jobs")
    parser.add_argument("--rounds", type=int, default=2, help="part (c): alternating rounds")
    parser.add_argument(
        "--replicas", type=int, default=1, help="part (d): start this many vLLM servers (with --shard-jobs)"
    )
    parser.add_argument(
        "--endpoint-delay-s",
        type=float,
        default=0.0,
        help="part (c) against the canned endpoint answering after this many seconds, not vLLM: "
        "the clients' scheduling alone, without a shared server's noise",
    )
    parser.add_argument(
        "--compare-pythonpath", help="part (c): also run the shard jobs on this src/ (e.g. an older checkout)"
    )
    args = parser.parse_args()
    if args.serve_instant:
        serve_instant(args.serve_instant, args.endpoint_delay_s)
        return
    logging.basicConfig(level=logging.WARNING)
    if not args.shard_jobs:
        part_instant(args.instant_requests, args.concurrency)
    if args.instant_only:
        return
    process = None
    base_url, name = args.base_url, args.served_model_name
    if args.shard_jobs and args.endpoint_delay_s:
        process, base_url = start_instant(args.endpoint_delay_s)
    elif base_url is None:
        model = args.model or str(REPO / "resources/demo/target")
        process, base_url = start_vllm(str(Path(model).resolve()), 2048)
        name = "bench"
    model = str(Path(args.model or REPO / "resources/demo/target").resolve())
    more = args.replicas - 1 if args.shard_jobs else 0
    replicas = [start_vllm(model, 2048) for _ in range(more)]  # part (d): the other servers
    try:
        if replicas:
            part_replicas(
                [base_url] + [url for _, url in replicas],
                name,
                args.requests,
                args.shard_jobs,
                args.concurrency,
                args.max_tokens,
                args.rounds,
            )
            return
        if args.shard_jobs:
            part_shard_jobs(
                base_url,
                name,
                args.requests,
                args.shard_jobs,
                args.concurrency,
                args.max_tokens,
                args.rounds,
                args.compare_pythonpath,
            )
            return
        part_server(
            base_url, name, args.requests, args.sequential_requests, args.concurrency, args.max_tokens
        )
    finally:
        for child in [process, *(p for p, _ in replicas)]:
            if child is not None:
                os.killpg(child.pid, 15)
                child.wait(60)


if __name__ == "__main__":
    main()
