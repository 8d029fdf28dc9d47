"""The suite's one vLLM launcher (`VllmServer`) and its shared session fixture ``demo_vllm_server``: the real
vLLM CPU server (.venv-vllm) serving the demo target.

The target is resources/demo/target when it is built (rule build_demo_target); otherwise the one shipped
in tests/data/demo-target/ (support.demo_target_data), copied into .pytest_cache/demo-target/<key>/, or,
when that copy is stale, one fitted there with TEST_FIT and reused by later sessions (every test that
needs a fitted target: `demo_target_dir()`, or `copy_demo_target` for a private copy).
The shared server runs the ExecStart of the demo's own unit template, on a free 127.0.0.1 port. A test
that must kill, restart or reconfigure its server starts its own `VllmServer` (support.generation_server).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import demo_target_data
from support.costs import COUNTER
from support.requirements import VLLM_PYTHON, require  # noqa: F401 (VLLM_PYTHON: importable here, as before)

from eagle3_pipeline.demo.fit import FitOptions
from eagle3_pipeline.demo.target import (
    SERVED_MODEL_NAME,
    build_demo_target,
    render_unit,
)
from eagle3_pipeline.ports import free_port
from eagle3_pipeline.server.unit import command_argv, merge_unit
from eagle3_pipeline.settings import DemoSettings

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "config" / "demo" / "sample.jsonl"
UNIT_TEMPLATE = REPO / "config" / "demo" / "vllm-demo.service.in"
BUILT_TARGET = REPO / "resources" / "demo" / "target"
# what the rule's 240 CPU seconds give on 2 idle cores (about 290 steps), as a step count: the suite's
# other worker shares the cores during the fit, and a CPU budget then buys fewer steps (208 in one run,
# a target that did not close </think>); a fixed count gives the same target under any load. One
# thread: beside the other worker's busy core, 2 threads took 2.2x the wall time and 2.8x the CPU
# time of 1 (benchmarks/demo_fit_threads.py).
TEST_FIT = FitOptions(steps=290, threads=1)
TEST_DEMO = DemoSettings(port=18500)  # the schema's seed; TEST_FIT's steps replace its CPU budget
HEALTH_TIMEOUT_S = 600.0  # a loaded 2-core machine


def cpu_vllm_env() -> dict[str, str]:
    """The environment the demo unit gives vLLM's CPU build (its Environment= lines, by the snapshot's
    parser): every vLLM process the suite starts outside that unit takes the same (KV cache size, no
    thread binding, the engine core's model in its own process on one OpenMP thread)."""
    unit = render_unit(UNIT_TEMPLATE.read_text(), REPO, BUILT_TARGET, 0)
    return dict(merge_unit([("vllm-demo.service", unit)], "vllm-demo.service").environment)


def draft_server_command(target: Path, draft: Path, port: int, max_model_len: int, k: int = 3) -> list[str]:
    """vLLM's OpenAI server on 127.0.0.1:`port` serving `target` with the EAGLE-3 `draft` at k speculative
    tokens, eager (the CPU build needs it for a draft)."""
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": k})
    return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
            "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
            "--max-model-len", str(max_model_len), "--speculative-config", spec]  # fmt: skip


def demo_target_dir() -> Path:
    """The built demo target, or one built (once, cached) under .pytest_cache for the tests."""
    if demo_target_data.has_weights(BUILT_TARGET) and (BUILT_TARGET / "tokenizer.json").exists():
        return BUILT_TARGET
    key = demo_target_data.key(TEST_DEMO, TEST_FIT)
    cached = REPO / ".pytest_cache" / "demo-target" / key
    cached.mkdir(parents=True, exist_ok=True)
    # one fit however many sessions (or xdist workers) ask at once: the others wait for it
    with (cached / "fit.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not demo_target_data.has_weights(cached / "target") and not demo_target_data.install_shipped(
            cached / "target", key
        ):
            COUNTER.fits_in_process += 1
            build_demo_target(
                SAMPLE, UNIT_TEMPLATE, cached / "target", cached / "vllm-demo.service",
                TEST_DEMO, TEST_FIT, repo=REPO,
            )  # fmt: skip
    return cached / "target"


def copy_demo_target(directory: Path) -> Path:
    """A private copy of the demo target in `directory`/target (hard links where the file system allows:
    nothing rewrites a target's files in place), for a test whose server must outlive a rebuild."""
    return Path(shutil.copytree(demo_target_dir(), directory / "target", copy_function=_link_or_copy))


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


class VllmServer:
    """A real vLLM CPU server process (`command`, its own process group) answering on 127.0.0.1:`port`;
    ``kill()``, ``start(wait=False)`` and ``restart()`` serve tests that kill it mid-run."""

    def __init__(self, command: list[str], env: dict[str, str], port: int, log_path: Path, model: str):
        self.command, self.env, self.port, self.log_path = command, env, port, log_path
        self.model = self.served_model_name = model
        self.base_url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self, wait: bool = True, timeout_s: float = HEALTH_TIMEOUT_S) -> VllmServer:
        """Start the server and (`wait`) wait for /health; fail with the log's tail if it does not come up."""
        self.starts += 1
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        if wait:
            self.wait_healthy(timeout_s)
        return self

    def wait_healthy(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM exited with {self.process.returncode} while starting:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(1.0)
        self.kill()
        pytest.fail(f"vLLM /health not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the server's whole process group (the API server and its engine core) and reap it."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """Terminate gracefully (SIGTERM), killing after 30 s."""
        self.kill(signal.SIGTERM)

    def restart(self) -> None:
        self.kill()
        self.start()


class DemoServer(VllmServer):
    """The demo target served by the ExecStart of the demo's own unit template (as a user's unit runs)."""

    def __init__(self, target_dir: Path, port: int, log_path: Path) -> None:
        unit = render_unit(UNIT_TEMPLATE.read_text(), REPO, target_dir, port)
        parsed = merge_unit([("vllm-demo.service", unit)], "vllm-demo.service")  # the snapshot's parser
        command = command_argv(parsed.exec_start[-1], parsed.environment, [])
        super().__init__(command, {**os.environ, **parsed.environment}, port, log_path, SERVED_MODEL_NAME)
        self.target_dir = target_dir

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="session")
def demo_vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    """The demo target served by the real vLLM CPU build on 127.0.0.1 (session-scoped)."""
    require("vllm")
    target = demo_target_dir()
    server = DemoServer(target, free_port(), tmp_path_factory.mktemp("vllm") / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
