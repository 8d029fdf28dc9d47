"""Host memory of one vllm extraction client (rule extract_hidden_states), what profiles/slurm asks for.

Snakemake starts every client of an engine's group at once; each plans its shard, then waits for one of
`hidden_states.vllm.max_clients` slots to queue its batches, then packs in one of `pack_slots`. So what a
group needs on top of its engine is every client's floor while it waits (the interpreter, its imports
and its plan) plus the packing of the few that pack at once. Each phase runs in a fresh interpreter and
its peak RSS is read from os.wait4 (benchmarks/merge.py's way), for a shard of the Kimi example's shape
(hidden 7,168, 61 layers, batch_tokens 32,768, max_seq_len 10,240):

  planned  a client's imports, its shard planned (both splits: 196 + 4 samples of --tokens each) and
           its engine request written (engine.enqueue's JSON): what every waiting client holds
  packing  one split of --pack-samples samples of --pack-tokens packed from real parts (bf16 at the
           example's width, as the engine writes them) into its shard and validated: the floor plus
           one part's slices in flight (page cache is not RSS: it is reclaimable, written back per part)

    .venv/bin/python benchmarks/client_memory.py                      # the expected length (3,512)
    .venv/bin/python benchmarks/client_memory.py --tokens 10240       # every sample at the bound
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

KIMI_CONFIG = {"text_config": {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
                               "vocab_size": 163840}}  # fmt: skip
SPLITS = {"train": 196, "validation": 4}  # a 200-sample shard at the example's 2% validation
PROMPT_TOKENS = 512  # budget.DEFAULT_PROMPT_TOKENS


def _settings():
    from eagle3_pipeline.settings import HiddenStatesSettings

    return HiddenStatesSettings(max_seq_len=10240, batch_tokens=32768, layers="auto")


def _write_inputs(folder: Path, samples: dict[str, int], tokens: int) -> None:
    """The target's config.json (Kimi's shape) and each split's traces, server-style token ids."""
    import polars as pl

    (folder / "target").mkdir(parents=True, exist_ok=True)
    (folder / "target" / "config.json").write_text(json.dumps(KIMI_CONFIG))
    completion = tokens - PROMPT_TOKENS
    for split, n in samples.items():
        rows = [
            {
                "id": f"{split}{i:04d}",
                "shard": 0,
                "prompt_token_ids": [1000 + (i + t) % 150000 for t in range(PROMPT_TOKENS)],
                "completion_token_ids": [2000 + (i * 7 + t) % 150000 for t in range(completion)],
            }
            for i in range(n)
        ]
        pl.DataFrame(rows, schema_overrides={"shard": pl.Int32, "prompt_token_ids": pl.List(pl.Int32),
                                             "completion_token_ids": pl.List(pl.Int32)}).write_parquet(
            folder / f"{split}.parquet"
        )  # fmt: skip


def _job(folder: Path, split: str):
    from eagle3_pipeline.hidden_states.job import ShardJob

    out = folder / "out"
    return ShardJob(folder / f"{split}.parquet", 0, folder / "target", out / f"{split}.safetensors",
                    out / f"{split}.json", folder / "work" / split)  # fmt: skip


def _rss_mb(kind: str = "RssAnon") -> float:
    """This process's resident memory of `kind` (/proc/self/status: RssAnon, RssFile, VmRSS), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{kind}:"):
            return int(line.split()[1]) / 1024
    return 0.0


class AnonPeak:
    """The peak of RssAnon, sampled every 20 ms in a thread: the memory a process cannot give back.
    Its file-backed pages (safetensors' mmap of a part, the shard read back for validation) are page
    cache the kernel reclaims under a cgroup's limit; os.wait4's peak RSS counts them too."""

    def __init__(self) -> None:
        import threading

        self.peak, self._stop = _rss_mb(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_mb())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(max(self.peak, _rss_mb()))


def child_planned(folder: Path) -> dict:
    """What a waiting client holds: rule extract_hidden_states' imports, its plans, its request."""
    import eagle3_pipeline.hidden_states.__main__  # noqa: F401 - the client's own imports
    from eagle3_pipeline.hidden_states import engine, vllm_extraction  # noqa: F401
    from eagle3_pipeline.hidden_states.plan import plan_shard

    imported, peak = _rss_mb(), AnonPeak()
    plans = [plan_shard(_settings(), _job(folder, split)) for split in SPLITS]
    batches = [
        {"part": f"part-{b}", "index": batch, "input_ids": [plan.seqs[i].input_ids for i in batch]}
        for plan in plans
        for b, batch in enumerate(plan.batches)
    ]
    (folder / "queue").mkdir(exist_ok=True)
    name = engine.enqueue(folder, {"batches": batches, "records": []})
    return {
        "tokens": sum(len(s) for plan in plans for s in plan.seqs),
        "request_mb": round((folder / "queue" / f"{name}.json").stat().st_size / 2**20, 1),
        "imported_anon_mb": round(imported),
        "held_anon_mb": round(_rss_mb()),  # while it waits for a slot and for the engine
        "peak_anon_mb": peak.stop(),
    }


def write_parts(folder: Path) -> dict:
    """The packing split's parts, as the engine writes them (engine_loop.write_part), in bf16."""
    import torch

    from eagle3_pipeline import io
    from eagle3_pipeline.hidden_states.parts import part_path, prepare_work
    from eagle3_pipeline.hidden_states.plan import plan_shard

    plan = plan_shard(_settings(), _job(folder, "pack"))
    parts = prepare_work(plan.job.work, "benchmark")
    hidden = KIMI_CONFIG["text_config"]["hidden_size"]
    for b, batch in enumerate(plan.batches):
        tokens = sum(len(plan.seqs[i]) for i in batch)
        io.write_safetensors(
            {
                "index": torch.tensor(batch, dtype=torch.int64),
                "aux_hidden_states": torch.full((tokens, 3 * hidden), 0.5, dtype=torch.bfloat16),
                "final_hidden_states": torch.full((tokens, hidden), 0.25, dtype=torch.bfloat16),
            },
            part_path(parts, b),
        )
    return {
        "parts": len(plan.batches),
        "part_gb": round(sum(p.stat().st_size for p in parts.iterdir()) / 1e9, 2),
    }


def child_packing(folder: Path) -> dict:
    """One split packed from its parts (packing.finish_shard, no slot folder) and validated."""
    import eagle3_pipeline.hidden_states.__main__  # noqa: F401
    from eagle3_pipeline.hidden_states import packing
    from eagle3_pipeline.hidden_states.plan import plan_shard

    plan = plan_shard(_settings(), _job(folder, "pack"))
    before, peak = _rss_mb(), AnonPeak()
    started = time.perf_counter()
    meta = packing.finish_shard(_settings(), plan, {"compute_dtype": "bfloat16"})
    return {"tokens": meta["num_tokens"], "planned_anon_mb": round(before), "peak_anon_mb": peak.stop(),
            "pack_s": round(time.perf_counter() - started, 1)}  # fmt: skip


def measure(phase: str, folder: Path) -> dict:
    """Run `phase` in a fresh interpreter; its peak RSS (os.wait4) and what it printed."""
    command = [sys.executable, __file__, "--child", phase, "--dir", str(folder)]
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{phase} failed with status {child.returncode}")
    # peak_rss_mb: os.wait4's, file-backed pages included
    return {"phase": phase, "peak_rss_mb": round(usage.ru_maxrss / 1024), **json.loads(output)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=PROMPT_TOKENS + 3000, help="each sample's length")
    parser.add_argument("--pack-samples", type=int, default=8)
    parser.add_argument("--pack-tokens", type=int, default=10240, help="the packed samples' length")
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--child", choices=("planned", "packing"))
    args = parser.parse_args()
    if args.child:
        handler = {"planned": child_planned, "packing": child_packing}[args.child]
        sys.stdout.write(json.dumps(handler(args.dir)) + "\n")
        return
    with tempfile.TemporaryDirectory(prefix="client-memory-", dir=args.dir) as scratch:
        folder = Path(scratch)
        _write_inputs(folder, SPLITS, args.tokens)
        sys.stdout.write(json.dumps(measure("planned", folder)) + "\n")
        _write_inputs(folder, {"pack": args.pack_samples}, args.pack_tokens)
        sys.stdout.write(json.dumps({"phase": "parts", **write_parts(folder)}) + "\n")
        sys.stdout.write(json.dumps(measure("packing", folder)) + "\n")


if __name__ == "__main__":
    main()
