"""A real vLLM CPU server (.venv-vllm) on the demo target for the generation integration tests, that a
test can kill and restart on the same port, with or without a reasoning parser.

The model is resources/demo/target when rule build_demo_target has built it, otherwise the test build
that support.vllm_server caches. Unlike `demo_vllm_server` (session-wide, shared), these servers are
this suite's own, on ports 18540-18559, so a test may kill one or start one without a parser.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from eagle3_pipeline.ports import free_port

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm/bin/python"


class VllmProcess:
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1:port in its own process group."""

    def __init__(
        self, model: Path, log_dir: Path, reasoning_parser: str | None = "kimi_k2", max_model_len=512
    ):
        self.model, self.log_dir, self.port = model, log_dir, free_port(18540, 18559)
        self.reasoning_parser, self.max_model_len = reasoning_parser, max_model_len
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.served_model_name = "eagle3-demo-target"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self, wait: bool = True) -> VllmProcess:
        argv = [
            str(VLLM_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--max-num-seqs",
            "16",
        ]
        if self.reasoning_parser:
            argv += ["--reasoning-parser", self.reasoning_parser]
        env = dict(
            os.environ,
            VLLM_CPU_KVCACHE_SPACE="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
        )
        self.starts += 1
        log = open(self.log_dir / f"vllm-{self.port}-{self.starts}.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited; see {self.log_dir}/vllm-{self.port}-{self.starts}.log")
            try:
                if requests.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM not healthy within {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL the whole process group (API server and engine core), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(60)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def generation_target(tmp_path_factory) -> Path:
    """A private copy of the demo target (resources/demo/target, or the test build cached by
    support.vllm_server), so that a rebuild of the demo target during the session cannot break a server."""
    from support.vllm_server import demo_target_dir

    copy = tmp_path_factory.mktemp("generation") / "target"
    shutil.copytree(demo_target_dir(), copy)
    return copy


@pytest.fixture(scope="module")
def vllm_server(generation_target, tmp_path_factory):
    """A started vLLM server with the kimi_k2 reasoning parser (module scope: started once)."""
    if not VLLM_PYTHON.exists():
        pytest.skip(".venv-vllm is not installed")
    server = VllmProcess(generation_target, tmp_path_factory.mktemp("vllm")).start()
    yield server
    server.stop()
