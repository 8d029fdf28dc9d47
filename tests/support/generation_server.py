"""A real vLLM CPU server (.venv-vllm) on the demo target for the generation integration tests, that a
test can kill and restart on the same port, with or without a reasoning parser.

The model is resources/demo/target when rule build_demo_target has built it, otherwise the test build
that support.vllm_server caches. Unlike `demo_vllm_server` (session-wide, shared), these servers are
this suite's own, on ports 18540-18559, so a test may kill one or start one without a parser.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.requirements import REPO, VLLM_PYTHON, require
from support.vllm_server import VllmServer, copy_demo_target, cpu_vllm_env

from eagle3_pipeline.ports import free_port

__all__ = ["REPO", "VllmProcess", "generation_target", "vllm_server"]


class VllmProcess(VllmServer):
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1:port (18540-18559), with or without a
    reasoning parser and with a short context (512), through the suite's one launcher."""

    def __init__(
        self, model: Path, log_dir: Path, reasoning_parser: str | None = "kimi_k2", max_model_len=512
    ):
        port = free_port(18540, 18559)
        argv = [
            str(VLLM_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            "eagle3-demo-target",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(max_model_len),
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--max-num-seqs",
            "16",
        ]
        if reasoning_parser:
            argv += ["--reasoning-parser", reasoning_parser]
        env = {**os.environ, **cpu_vllm_env()}
        super().__init__(argv, env, port, log_dir / f"vllm-{port}.log", "eagle3-demo-target")
        self.target_dir, self.reasoning_parser, self.max_model_len = model, reasoning_parser, max_model_len


@pytest.fixture(scope="session")
def generation_target(tmp_path_factory) -> Path:
    """A private copy of the demo target (resources/demo/target, or the test build cached by
    support.vllm_server), so that a rebuild of the demo target during the session cannot break a server."""
    return copy_demo_target(tmp_path_factory.mktemp("generation"))


@pytest.fixture(scope="module")
def vllm_server(generation_target, tmp_path_factory):
    """A started vLLM server with the kimi_k2 reasoning parser (module scope: started once)."""
    require("vllm")
    server = VllmProcess(generation_target, tmp_path_factory.mktemp("vllm")).start()
    yield server
    server.stop()
