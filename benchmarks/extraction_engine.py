"""The extraction engine's busy fraction as a real run gets it: consumers started by Snakemake.

Default (`workflow`): the pipeline's own rules, run by `snakemake` on synthetic shards. The benchmark
writes what rule filter_traces and the server snapshot would (S shards of server-style token ids, both
splits; server.json naming .venv-vllm's interpreter), then runs

    snakemake <every shard's states> --cores C --allowed-rules check_disk_budget extract_hidden_states \
        serve_extraction_engine

so the engine job (rule serve_extraction_engine) and its S extraction jobs run as one group, started by
Snakemake as in a real run: each client is a Snakemake `script:` job that imports, plans its shard,
takes one of `hidden_states.vllm.max_clients` slots, queues, waits and packs. Nothing is queued by the
benchmark. Each case is one snakemake call in a fresh folder on the same traces:

  after     the pipeline as it is: a client plans before it takes a slot and packs after it left
            it, so the next shard's request is queued while the previous one's batches run
  checkout  the workflow and package of --checkout (another commit's tree: `git archive REV | tar -x
            -C DIR`), e.g. the commit before issue 37's item 5, side by side in the same run

and prints, from the engine's own stats (the engine folder's stopped.json, the run's
results/RUN/hidden_states/engine_stats/ record), the busy fraction over the engine's ready time (time
in engine steps / wall from the engine ready to the last request done), the engine seconds per shard
(the production-like ratio: a 200-sample shard of 3.5k-token conversations is 35-70 s of engine work on
8 GPUs at make cost's 10,000-20,000 tokens/s; here several seconds on the CPU build, on a target of
the demo's shape: H=128, 8 layers, vocab 1,024; a client packs a shard in about 0.4x its engine time
here, 0.4-0.8x in production at 57 KB per token), where the rest went, and each request's
queued/taken/done times. One JSON line per case, the last the summary, with `pool_fits`: whether
Snakemake started every client with the engine (see pool_fits()).

    .venv/bin/python benchmarks/extraction_engine.py                # 5 shards of 108k tokens, 2 cores
    git archive 9e389ec | tar -x -C /tmp/before   # the code before item 5
    .venv/bin/python benchmarks/extraction_engine.py --checkout /tmp/before --repeats 2
    .venv/bin/python benchmarks/extraction_engine.py --prequeued           # the issue-22 comparison

`--prequeued`: the former in-process comparison (issue 22): the drained loop (drain_engine.py, the
engine process of the "before") against the streaming engine with every shard's request queued before
the engine is ready (0.75 -> 0.91 on 2026-12-02): an upper bound for the engine loop, not what a run
gets (that run: --shards 8 --tokens-per-shard 4096 --batch-tokens 512).
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

import polars as pl
import yaml

from eagle3_pipeline.config import check_config
from eagle3_pipeline.hidden_states import (
    cost,
    engine,
    engine_health,
    final_norm,
    plan,
    sequences,
    vllm_backend,
)
from eagle3_pipeline.settings import VllmEngineSettings, build_settings
from eagle3_pipeline.target_shape import engine_layer_ids

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from hidden_states import DEMO_TARGET, random_target, synthetic_traces  # noqa: E402

RUN = "bench"
SPLITS = ("train", "validation")
# the demo unit's environment for vLLM's CPU build (config/demo/vllm-demo.service.in), as its snapshot
CPU_VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# "checkout" runs the workflow and package of --checkout (another commit's tree) instead of this one's
CASES = ("checkout", "after")


def emit(**record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------------------------------
# workflow: the consumers started by Snakemake


def shard_traces(path: Path, vocab: int, tokens: int, shard: int) -> Path:
    """Synthetic server-style trace rows of `tokens` tokens for shard `shard` (filter_traces' file)."""
    synthetic_traces(path, vocab, tokens, seed=shard * 2 + (path.parent.name == "validation"))
    frame = pl.read_parquet(path).with_columns(
        pl.lit(shard, dtype=pl.Int32).alias("shard"),
        (pl.lit(f"s{shard}-") + pl.col("id")).alias("id"),
    )
    frame.write_parquet(path)
    return path


def write_workdir(work: Path, target: Path, args: argparse.Namespace, traces: Path) -> list[str]:
    """The inputs of the extraction rules in `work` (traces linked from `traces`, the snapshot, the
    config); returns the snakemake targets (every shard's states)."""
    results = work / "results" / RUN
    for split in SPLITS:
        (results / "traces" / "shards" / split).mkdir(parents=True)
        for source in sorted((traces / split).glob("*.parquet")):
            (results / "traces" / "shards" / split / source.name).symlink_to(source)
    (results / "server").mkdir()
    (results / "server" / "stopped.json").write_text("{}\n")
    snapshot = {
        "python": str(args.vllm_python),
        "tensor_parallel_size": 1,
        "max_model_len": args.max_seq_len + 1,
        "trust_remote_code": False,
        "args": {"--dtype": "bfloat16", "--enforce-eager": True},
        "env": CPU_VLLM_ENV,
    }
    (results / "server" / "server.json").write_text(json.dumps(snapshot))
    (work / "config").symlink_to(checkout_of(args, work.name) / "config")
    hidden_states = {
        "backend": "vllm",
        "max_seq_len": args.max_seq_len,
        "batch_tokens": args.batch_tokens,
        "vllm": {"max_clients": args.max_clients},
    }
    config = {"run": RUN, "demo": {"enabled": False}, "target": {"model": str(target)}}
    (work / "c.yaml").write_text(yaml.safe_dump(config | {"hidden_states": hidden_states}))
    return [
        f"results/{RUN}/hidden_states/{split}/shard-{k:05d}.safetensors"
        for k in range(args.shards)
        for split in SPLITS
    ]


def checkout_of(args: argparse.Namespace, folder: str) -> Path:
    """The tree a case's folder runs: --checkout for the checkout case, else this repository."""
    return args.checkout.resolve() if folder.startswith("checkout-") else REPO


def run_workflow(case: str, work: Path, target: Path, traces: Path, args: argparse.Namespace) -> dict:
    """One snakemake call extracting every shard; the engine's stats and the requests' timeline."""
    targets = write_workdir(work, target, args, traces)
    tree = checkout_of(args, work.name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES")}
    env |= {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    env |= CPU_VLLM_ENV
    if tree != REPO:  # its package ahead of this checkout's editable install, in every job and the engine
        env["PYTHONPATH"] = str(tree / "src")
    command = [
        sys.executable, "-m", "snakemake", "--snakefile", str(tree / "Snakefile"), "--directory", str(work),
        *targets, "--configfile", "c.yaml", "--cores", str(args.cores),
        "--allowed-rules", "check_disk_budget", "extract_hidden_states", "serve_extraction_engine",
    ]  # fmt: skip
    load_before, start = load(), time.perf_counter()
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"snakemake failed ({case}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    results = work / "results" / RUN
    # the run's own record of its engine start (engine.write_record); the engine folder's report else
    recorded = sorted((results / "hidden_states" / "engine_stats").glob("*.json"))
    stopped = results / "work" / "hidden_states" / "engine" / "stopped.json"
    report = json.loads((recorded[-1] if recorded else stopped).read_text())
    tokens = sum(
        json.loads((results / "hidden_states" / s / f"shard-{k:05d}.json").read_text())["num_tokens"]
        for k in range(args.shards)
        for s in SPLITS
    )
    busy = report.get("busy_s") or 0.0
    return {
        "measure": "workflow",
        "case": case,
        "shards": args.shards,
        "tokens": tokens,
        "engine_s_per_shard": round(busy / args.shards, 2),
        "busy_fraction": report.get("busy_fraction"),
        "busy_s": busy,
        "ready_to_done_s": report.get("ready_to_done_s"),
        "idle_s": report.get("idle_s"),
        "engine_start_s": report.get("engine_start_s"),
        "requests": report.get("requests"),
        # each request (one per extraction job): queued, taken, done, in s from the engine ready
        "timeline": [[r["queued_s"], r["taken_s"], r["done_s"]] for r in report.get("timeline") or []],
        "recorded_in_results": [p.name for p in recorded],
        "snakemake_wall_s": round(wall, 1),
        "load_before": load_before,
        "load_after": load(),
    }


def pool_fits(shards: int, cores: int) -> bool:
    """Whether Snakemake's local executor starts every job of the engine's group at once: it runs them
    in a pool of cores + 5 threads (grown to the group's size, without counting the thread running the
    group itself), so with more than cores + 3 clients (cores + 4 jobs with the engine) one starts only
    once another has finished, and plans late: 5 clients fit on 2 cores."""
    return shards + 2 <= cores + 5


def workflow(args: argparse.Namespace, work: Path, target: Path) -> None:
    info = plan.target_info(target)
    traces = work / "traces"
    for split in SPLITS:
        (traces / split).mkdir(parents=True)
        tokens = args.tokens_per_shard if split == "train" else max(args.tokens_per_shard // 8, 256)
        for k in range(args.shards):
            shard_traces(traces / split / f"shard-{k:05d}.parquet", info.vocab_size, tokens, k)
    results: dict[str, list[dict]] = {case: [] for case in CASES}
    order = [case for _ in range(args.repeats) for case in args.cases]
    for i, case in enumerate(order):
        out = run_workflow(case, work / f"{case}-{i}", target, traces, args)
        results[case].append(out)
        emit(**out)
    summary = {
        f"busy_fraction_{case}": [r["busy_fraction"] for r in runs] for case, runs in results.items() if runs
    }
    summary |= {
        f"engine_s_per_shard_{case}": [r["engine_s_per_shard"] for r in runs]
        for case, runs in results.items()
        if runs
    }
    emit(
        measure="summary", order=order, cores=args.cores, max_clients=args.max_clients,
        pool_fits=pool_fits(args.shards, args.cores), **summary, load=load(),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# prequeued: the issue-22 comparison in one process (every request queued before the engine is ready)


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


def wait_ready(directory: Path, info: dict, timeout_s: float = 3600) -> dict:
    """The engine's ready record once it is up (timing its start: the pipeline's clients never wait
    for it, they queue at once); exits with its log's tail when it failed or died first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready_file = directory / "ready.json"
        ready = json.loads(ready_file.read_text()) if ready_file.exists() else {}
        if ready.get("start_id") == info["start_id"]:
            return ready
        failure = engine_health.read_failure(directory, info["start_id"])
        if failure or not engine.engine_alive(directory, info):
            raise SystemExit(f"the engine did not start: {failure}\n{engine.log_tail(directory, info=info)}")
        time.sleep(engine.POLL_S)
    raise SystemExit(f"the engine was not ready after {timeout_s:.0f} s")


def run_prequeued(
    mode: str, target: Path, work: Path, requests: list[dict], args: argparse.Namespace
) -> dict:
    """Start one engine in `mode`, feed it the shards (one after another, or all at once), stop it."""
    info = plan.target_info(target)
    options = VllmEngineSettings(dtype="bfloat16", enforce_eager=True, max_model_len=2048)
    settings = vllm_backend.engine_settings(options, None, 2047, args.batch_tokens)
    layers = sequences.resolve_layers(["auto"], info.num_layers)
    layer_ids = engine_layer_ids(layers, info.num_layers)
    directory = work / f"engine-{mode}"
    in_flight = vllm_backend.in_flight_tokens(options, settings)
    spec = vllm_backend.engine_spec(
        target, settings, layer_ids, "bfloat16", final_norm.find_final_norm(target).as_dict(),
        vllm_backend.staging_dir(options, directory, in_flight, info.hidden_size), in_flight, 600,
    )  # fmt: skip
    directory.mkdir(parents=True)
    env = vllm_backend.worker_env(vllm_backend.package_path(directory), None)
    worker = engine.WORKER_MODULE
    if mode == "drain":  # the former loop: this folder's drain_engine.py, beside the package
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "benchmarks"), env["PYTHONPATH"]])
        worker = "drain_engine"
    start = time.perf_counter()
    info = engine.start_or_join(directory, str(args.vllm_python), spec, env, worker)
    if mode == "drain":  # the per-shard jobs: one after another, each once the engine is ready
        wait_ready(directory, info)
        start_s = time.perf_counter() - start
        for request in requests:
            engine.wait_done(directory, info, engine.enqueue(directory, request))
    else:  # every shard's client queues at once, before the engine is ready
        names = [engine.enqueue(directory, request) for request in requests]
        wait_ready(directory, info)
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


def prequeued(args: argparse.Namespace, work: Path, target: Path) -> None:
    schema = REPO / "config" / "schema.yaml"
    for name in ("config/config.yaml", "config/examples/kimi-k2.5-8gpu.yaml"):
        settings = build_settings(check_config(yaml.safe_load((REPO / name).read_text()), schema))
        hidden = 7168 if "kimi" in name else 128
        out = cost.estimate(settings, hidden)
        today = out["plan"]["extraction_jobs"]  # one engine per extraction job before
        emit(measure="engine_starts", config=name, before=today, after=out["engine_starts"])
    results = {}
    for mode in ("drain", "stream"):
        requests = shard_requests(target, work / mode, args.shards, args.tokens_per_shard, args.batch_tokens)
        results[mode] = run_prequeued(mode, target, work / mode, requests, args)
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prequeued", action="store_true", help="the issue-22 in-process comparison")
    parser.add_argument("--shards", type=int, default=5, help="at most --cores + 3: see pool_fits")
    parser.add_argument("--tokens-per-shard", type=int, default=96000, help="train split; validation 1/8")
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--max-seq-len", type=int, default=1024, help="the synthetic rows: at most 996")
    parser.add_argument("--max-clients", type=int, default=2, help="hidden_states.vllm.max_clients")
    parser.add_argument("--cores", type=int, default=2, help="snakemake --cores")
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=tuple(CASES),
        help="default: checkout and after with --checkout, else after",
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        help="another commit's tree, the checkout case (git archive REV | tar -x -C DIR)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="each case this many times, alternating")
    parser.add_argument("--target", type=Path, help="default: the demo's (resources/demo/target) if built")
    parser.add_argument("--random-target", action="store_true", help="a random Llama, H=128, vocab 1,024")
    parser.add_argument("--vllm-python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python")
    parser.add_argument(
        "--keep", type=Path, help="work in this folder and keep it (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    if args.cases is None:
        args.cases = ["checkout", "after"] if args.checkout else ["after"]
    if "checkout" in args.cases and args.checkout is None:
        parser.error("the checkout case needs --checkout")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    with tempfile.TemporaryDirectory(prefix="bench_engine_") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        built = DEMO_TARGET if (DEMO_TARGET / "config.json").exists() and not args.random_target else None
        # the demo target's shape (H=128, 8 layers, vocab 1,024) when it is not built
        target = args.target or built or random_target(work / "target", 128, 8, 1024)
        mode = "prequeued" if args.prequeued else "workflow"
        emit(measure="setup", mode=mode, target=str(target), shards=args.shards,
             tokens_per_shard=args.tokens_per_shard, batch_tokens=args.batch_tokens, load=load())  # fmt: skip
        (prequeued if args.prequeued else workflow)(args, work, target)


if __name__ == "__main__":
    main()
