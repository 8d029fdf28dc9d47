"""The extraction engine's former serving loop, the "before" of `extraction_engine.py --prequeued`: one
`LLM.generate` per batch, then reading and writing its states with the engine idle (the package's loop
streams: src/eagle3_pipeline/hidden_states/engine_loop.py).

The engine process of that benchmark's drain arm, in vLLM's interpreter, started by
`engine.start_or_join(..., worker="drain_engine")` with this folder on PYTHONPATH:

    python -m drain_engine serve ENGINE_DIR
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import vllm_worker
from eagle3_pipeline.hidden_states.engine_loop import IDLE_POLL_S, Finisher, Request, Server

# the vLLM names this loop uses beyond the package's (vllm_compat.py checks them in each release's wheel)
VLLM_NAMES = (
    ("name", "vllm", "SamplingParams"),
    ("name", "vllm", "TokensPrompt"),
    ("member", "vllm.entrypoints.llm", "LLM.generate"),
)


class DrainServer(Server):
    """The former loop: each request's batches run to the end, one `LLM.generate` each, then read and
    written before the next batch is sent."""

    def __init__(self, directory: Path, spec: dict[str, Any]) -> None:
        super().__init__(directory, spec)
        self.open: list[Request] = []

    def _accept(self, request: Request) -> None:
        self.open.append(request)

    def stats(self) -> dict[str, Any]:
        return super().stats() | {"mode": "drain"}

    def run(self, llm: Any, record: dict[str, Any]) -> None:
        from vllm import SamplingParams, TokensPrompt

        finisher = Finisher(self.spec)
        params = SamplingParams(max_tokens=1, temperature=0.0)
        self.ready_at = last_work = time.perf_counter()
        self.ready_wall = time.time()
        while True:
            self._take_requests(record)
            for request in self.open:
                for batch in request.batches:
                    start = time.perf_counter()
                    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in batch["input_ids"]]
                    outputs = llm.generate(prompts, params, use_tqdm=False)
                    self.last_step = time.perf_counter()
                    self.busy_s += self.last_step - start
                    ids = batch["input_ids"]
                    pieces = [finisher.states(out, seq) for out, seq in zip(outputs, ids, strict=True)]
                    request.tokens += Finisher.write_part(batch, pieces)
                self.tokens += request.tokens
                self._done(request)
                last_work = time.perf_counter()
            self.open.clear()
            if (self.directory / "stop").exists() or time.perf_counter() - last_work > self.idle_timeout:
                break
            time.sleep(IDLE_POLL_S)
        io.write_json(self.stats(), self.directory / "stats.json", indent=None)


if __name__ == "__main__":  # spawned engine processes re-import this module: keep the guard
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(vllm_worker.main(sys.argv[1:], DrainServer))
