"""The extraction engine, before and after issue 22: engine busy fraction, engine starts, tokens/s.

One run, two engines on the same synthetic shards (server-style token ids on the demo target, or a
random Llama), through the real engine service (hidden_states/engine.py, vllm_worker.py):

  before  the former loop (mode drain): each shard's batches in one `LLM.generate`, then reading, the
          final norm and the part written while the engine waits; the shards one after another, as the
          per-shard jobs ran (one GPU job at a time locally). Today's per-shard jobs also started one
          engine each: their tokens/s is composed as tokens / (shards x measured start + this wall).
  after   the streaming engine: every shard's client queues its request at once, before the engine
          is ready (as the jobs do), requests flow under the bounded in-flight window while a writer
          thread reads, normalises and writes parts.

busy fraction = time in engine steps / wall from the engine ready to the last request done (stats.json
of the engine, written by the worker, with where the rest went: before the first request, the
worker's own loop, the engine empty between requests, the tail after the last step). The engine
starts of the demo and the Kimi example come from `make cost` (hidden_states/cost.py). Prints one
JSON line per measurement, the last one the summary (before and after side by side):

    .venv/bin/python benchmarks/extraction_engine.py                 # 8 shards of ~1,100 tokens
    .venv/bin/python benchmarks/extraction_engine.py --shards 4 --tokens-per-shard 4096
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from eagle3_pipeline.config import check_config
from eagle3_pipeline.hidden_states import cost, engine, final_norm, plan, sequences, vllm_backend
from eagle3_pipeline.settings import VllmEngineSettings, build_settings

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from hidden_states import DEMO_TARGET, random_target, synthetic_traces  # noqa: E402


def emit(**record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def shard_requests(target: Path, work: Path, shards: int, tokens: int, batch_tokens: int) -> list[dict]:
    """One request per shard (its batches and part files), from synthetic server-style traces."""
    info = plan.target_info(target)
    work.mkdir(parents=True, exist_ok=True)
    requests = []
    for k in range(shards):
        traces = synthetic_traces(work / f"traces-{k}.parquet", info.vocab_size, tokens, seed=k)
        rows = sequences.load_trace_rows(traces, 0)
        seqs, _ = sequences.build_sequences(rows, 2047, "truncate", lambda: None)
        batches = sequences.longest_first_batches([len(s) for s in seqs], batch_tokens)
        parts = work / f"parts-{k}"
        parts.mkdir(parents=True, exist_ok=True)
        requests.append(
            {
                "batches": [
                    {
                        "part": str(parts / f"batch-{b:05d}.safetensors"),
                        "index": batch,
                        "input_ids": [seqs[i].input_ids for i in batch],
                    }
                    for b, batch in enumerate(batches)
                ],
                "records": [],
                "tokens": sum(len(s) for s in seqs),
            }
        )
    return requests


def run(mode: str, target: Path, work: Path, requests: list[dict], args: argparse.Namespace) -> dict:
    """Start one engine in `mode`, feed it the shards (one after another, or all at once), stop it."""
    info = plan.target_info(target)
    options = VllmEngineSettings(dtype="bfloat16", enforce_eager=True, max_model_len=2048)
    settings = vllm_backend.engine_settings(options, None, 2047, args.batch_tokens)
    layers = sequences.resolve_layers(["auto"], info.num_layers)
    layer_ids = sequences.vllm_layer_ids(layers) + [info.num_layers]
    directory = work / f"engine-{mode}"
    window = vllm_backend.in_flight_tokens(options, settings)
    spec = vllm_backend.engine_spec(
        target, settings, layer_ids, "bfloat16", final_norm.find_final_norm(target).as_dict(),
        vllm_backend.staging_dir(options, directory, window, info.hidden_size), window, 600, mode=mode,
    )  # fmt: skip
    directory.mkdir(parents=True)
    env = vllm_backend.worker_env(vllm_backend.package_path(directory), None)
    start = time.perf_counter()
    info = engine.start_or_join(directory, str(args.vllm_python), spec, env)
    if mode == "drain":  # the per-shard jobs: one after another, each once the engine is ready
        engine.wait_ready(directory, info)
        start_s = time.perf_counter() - start
        for request in requests:
            engine.submit(directory, info, request)
    else:  # every shard's client queues at once, before the engine is ready, as the jobs do
        names = [engine.enqueue(directory, request) for request in requests]
        engine.wait_ready(directory, info)
        start_s = time.perf_counter() - start
        for name in names:
            engine.wait_done(directory, info, name)
    wall = time.perf_counter() - start - start_s
    report = engine.stop_engine(directory)
    tokens = sum(r["tokens"] for r in requests)
    return {
        "measure": "engine",
        "mode": mode,
        "shards": len(requests),
        "tokens": tokens,
        "engine_start_s": round(start_s, 1),
        "extract_wall_s": round(wall, 2),
        "tokens_per_s_after_start": round(tokens / wall, 1),
        "busy_s": report.get("busy_s"),
        "ready_to_done_s": report.get("ready_to_done_s"),
        "busy_fraction": report.get("busy_fraction"),
        "busy_fraction_working": report.get("busy_fraction_working"),
        "idle_s": report.get("idle_s"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shards", type=int, default=8, help="the demo: 4 shards x 2 splits, and the baseline"
    )
    parser.add_argument("--tokens-per-shard", type=int, default=1100)
    parser.add_argument("--batch-tokens", type=int, default=512)
    parser.add_argument("--target", type=Path, help="default: the demo's (resources/demo/target)")
    parser.add_argument("--random-target", action="store_true")
    parser.add_argument("--vllm-python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    schema = REPO / "config" / "schema.yaml"
    for name in ("config/config.yaml", "config/examples/kimi-k2.5-8gpu.yaml"):
        settings = build_settings(check_config(yaml.safe_load((REPO / name).read_text()), schema))
        hidden = 7168 if "kimi" in name else 128
        out = cost.estimate(settings, hidden)
        today = out["plan"]["extraction_jobs"]  # one engine per extraction job before
        emit(measure="engine_starts", config=name, before=today, after=out["engine_starts"])
    with tempfile.TemporaryDirectory(prefix="bench_engine_") as tmp:
        work = Path(tmp)
        built = DEMO_TARGET if (DEMO_TARGET / "config.json").exists() and not args.random_target else None
        target = args.target or built or random_target(work / "target", 512, 8, 32000)
        emit(measure="setup", target=str(target), shards=args.shards, tokens_per_shard=args.tokens_per_shard)
        results = {}
        for mode in ("drain", "stream"):
            requests = shard_requests(
                target, work / mode, args.shards, args.tokens_per_shard, args.batch_tokens
            )
            results[mode] = run(mode, target, work / mode, requests, args)
            emit(**results[mode])
        before, after = results["drain"], results["stream"]
        per_shard_jobs = before["tokens"] / (
            before["shards"] * before["engine_start_s"] + before["extract_wall_s"]
        )
        one_engine = after["tokens"] / (after["engine_start_s"] + after["extract_wall_s"])
        emit(
            measure="summary",
            busy_fraction_before=before["busy_fraction"],
            busy_fraction_after=after["busy_fraction"],
            busy_fraction_working_before=before["busy_fraction_working"],
            busy_fraction_working_after=after["busy_fraction_working"],
            idle_s_before=before["idle_s"],
            idle_s_after=after["idle_s"],
            tokens_per_s_after_start_before=before["tokens_per_s_after_start"],
            tokens_per_s_after_start_after=after["tokens_per_s_after_start"],
            tokens_per_s_per_shard_jobs=round(per_shard_jobs, 1),
            tokens_per_s_one_engine=round(one_engine, 1),
            speedup_whole_extraction=round(one_engine / per_shard_jobs, 2),
        )


if __name__ == "__main__":
    main()
