"""Hidden-state extraction speed beside a bare forward pass, and bytes on disk beside the 4*H*2 floor.

On the same token batches of the same model:
  bare_stack      the decoder stack alone (what extraction cannot beat: every layer must run)
  causal_lm       the full LlamaForCausalLM forward (adds lm_head and [T, vocab] logits)
  output_hidden   causal_lm with output_hidden_states=True (the "plain transformers" way)
  capture         our capture_batch: stack + 3 layer hooks + bf16 copies to CPU
  extract_shard   the whole job: sequences, batches, capture, parts on disk, packed shard, validation
each in float32 and bfloat16 compute (CPU with AMX: bf16 matmuls), plus the bf16-vs-fp32 relative error
of the stored states, and the shard's bytes per token beside 4 * H * 2.

With --backends (needs .venv-vllm, or --vllm-python): the whole job through each backend on the same
sequences, side by side in one run (bf16 both): tokens/s of the job, tokens/s once the model is up
(the job minus the transformers load / the vLLM engine start), their ratio, bytes per token, and how
far the two backends' states are apart (cosine, relative error).

Prints one JSON line per measurement. Examples:
    .venv/bin/python benchmarks/hidden_states.py                       # demo target if built, else random
    .venv/bin/python benchmarks/hidden_states.py --hidden 1024 --layers 8 --vocab 32000 --tokens 8192
    .venv/bin/python benchmarks/hidden_states.py --backends --random-target   # vllm beside transformers
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import torch

from eagle3_pipeline.hidden_states import capture, extract, plan, sequences
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.settings import HiddenStatesSettings, section

REPO = Path(__file__).resolve().parent.parent
DEMO_TARGET = REPO / "resources" / "demo" / "target"


def emit(**record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def random_target(directory: Path, hidden: int, layers: int, vocab: int) -> Path:
    """A random Llama (head_dim 64) saved to `directory`: the benchmark needs no tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def synthetic_traces(path: Path, vocab: int, tokens: int, seed: int = 0) -> Path:
    """Trace rows with server-style ids: prompts of 32-96 tokens, completions of 128-900, `tokens` in all."""
    g = torch.Generator().manual_seed(seed)
    rows, total, i = [], 0, 0
    while total < tokens:
        n_prompt = int(torch.randint(32, 96, (1,), generator=g))
        n_completion = min(
            int(torch.randint(128, 900, (1,), generator=g)), max(16, tokens - total - n_prompt)
        )
        ids = torch.randint(0, vocab, (n_prompt + n_completion,), generator=g).tolist()
        rows.append(
            {
                "id": f"b{i:05d}",
                "shard": 0,
                "status": "ok",
                "prompt_token_ids": ids[:n_prompt],
                "completion_token_ids": ids[n_prompt:],
            }
        )
        total += len(ids)
        i += 1
    schema = {
        "shard": pl.Int32,
        "prompt_token_ids": pl.List(pl.Int32),
        "completion_token_ids": pl.List(pl.Int32),
    }
    pl.DataFrame(rows, schema_overrides=schema).write_parquet(path)
    return path


def timed(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """Best wall and best CPU seconds of each function over `repeats` rounds (after one warm-up each).

    Rounds interleave the functions so that a neighbour's burst hits all of them alike. The machine is
    shared: CPU seconds (this process) measure the work itself, wall seconds also count the time
    neighbours took the cores; with --threads 1 no thread spins while waiting for another.
    """
    best = {name: (float("inf"), float("inf")) for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def forward_variants(model: torch.nn.Module, batches: list[list[list[int]]], layers: list[int]) -> dict:
    base, _ = capture.decoder_parts(model)

    def each(run: Callable[[torch.Tensor], object]) -> Callable[[], None]:
        def go() -> None:
            with torch.inference_mode():
                for batch in batches:
                    run(capture.pad_right(batch, torch.device("cpu")))

        return go

    return {
        "bare_stack": each(lambda ids: base(input_ids=ids, use_cache=False)),
        "causal_lm": each(lambda ids: model(input_ids=ids, use_cache=False)),
        "output_hidden": each(lambda ids: model(input_ids=ids, use_cache=False, output_hidden_states=True)),
        "capture": lambda: [capture.capture_batch(model, b, layers, torch.bfloat16) for b in batches],
    }


def bench_forwards(target: Path, seqs: list[list[int]], args: argparse.Namespace, layers: list[int]) -> None:
    batches_idx = sequences.longest_first_batches([len(s) for s in seqs], args.batch_tokens)
    batches = [[seqs[i] for i in b] for b in batches_idx]
    tokens = sum(map(len, seqs))
    padded = sum(max(len(seqs[i]) for i in b) * len(b) for b in batches_idx)
    states = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = capture.load_target(target, dtype, torch.device("cpu"), device_map=False)
        for name, (seconds, cpu) in timed(forward_variants(model, batches, layers), args.repeats).items():
            emit(
                measure=name,
                compute_dtype=str(dtype)[6:],
                tokens=tokens,
                padded_tokens=padded,
                seconds=round(seconds, 4),
                tokens_per_s=round(tokens / seconds, 1),
                cpu_s=round(cpu, 4),
                tokens_per_cpu_s=round(tokens / cpu, 1),
            )
        states[dtype] = [capture.capture_batch(model, b, layers, torch.float32) for b in batches[:2]]
    pairs = [
        (a, b)
        for batch32, batch16 in zip(states[torch.float32], states[torch.bfloat16], strict=True)
        for a, b in zip(batch32, batch16, strict=True)
    ]
    for k, name in enumerate(("aux_hidden_states", "final_hidden_states")):
        err = (
            sum((b[k] - a[k]).norm() ** 2 for a, b in pairs) ** 0.5
            / sum(a[k].norm() ** 2 for a, _ in pairs) ** 0.5
        )
        emit(measure="bf16_vs_fp32_relative_error", tensor=name, value=round(float(err), 5))


def bench_extract(target: Path, traces: Path, work: Path, args: argparse.Namespace) -> None:
    for compute_dtype in ("float32", "bfloat16"):
        job = ShardJob(
            traces=traces,
            shard=0,
            target=target,
            output=work / f"shard-{compute_dtype}.safetensors",
            metadata=work / f"shard-{compute_dtype}.json",
            work=work / f"work-{compute_dtype}",
        )
        hidden_states = HiddenStatesSettings(
            backend="transformers",
            batch_tokens=args.batch_tokens,
            compute_dtype=compute_dtype,
            max_seq_len=4096,
        )
        start = time.perf_counter()
        capture.load_target(target, capture.DTYPES[compute_dtype], torch.device("cpu"), device_map=False)
        load_s = time.perf_counter() - start
        start, start_cpu = time.perf_counter(), time.process_time()
        meta = extract.extract_shards(hidden_states, [job])[0]
        seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        emit(
            measure="extract_shard",
            compute_dtype=compute_dtype,
            tokens=meta["num_tokens"],
            seconds=round(seconds, 3),
            model_load_s=round(load_s, 3),
            tokens_per_s=round(meta["num_tokens"] / seconds, 1),
            cpu_s=round(cpu, 3),
            tokens_per_cpu_s=round(meta["num_tokens"] / cpu, 1),
        )
        emit(
            measure="bytes_per_token",
            hidden_size=meta["hidden_size"],
            value=round(meta["bytes_per_token"], 2),
            floor=meta["floor_bytes_per_token"],
            ratio=round(meta["bytes_per_token"] / meta["floor_bytes_per_token"], 4),
            file_bytes=job.output.stat().st_size,
        )


def _agreement(a_path: Path, b_path: Path) -> dict[str, float]:
    """Worst per-token cosine and the relative error of shard b's states against shard a's."""
    from eagle3_pipeline.hidden_states import HiddenStateShard

    out = {}
    with HiddenStateShard(a_path) as a, HiddenStateShard(b_path) as b:
        for name in ("aux_hidden_states", "final_hidden_states"):
            x = a.tensor_slice(name, 0, a.num_tokens).float()
            y = b.tensor_slice(name, 0, b.num_tokens).float()
            if name == "aux_hidden_states":  # per layer: [T, 3H] -> [3T, H]
                x, y = x.reshape(-1, x.shape[1] // 3), y.reshape(-1, y.shape[1] // 3)
            cos = torch.nn.functional.cosine_similarity(x, y, dim=-1)
            out[f"{name}_min_cosine"] = round(float(cos.min()), 6)
            out[f"{name}_relative_error"] = round(float((x - y).norm() / x.norm()), 5)
    return out


def bench_backends(target: Path, traces: Path, work: Path, args: argparse.Namespace) -> None:
    """The same shard through transformers and vLLM, in one run; engine settings as the demo unit's."""
    import os
    import resource

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    vllm = {"python": str(args.vllm_python), "dtype": "bfloat16", "enforce_eager": True}
    results = {}
    for backend in ("transformers", "vllm"):
        job = ShardJob(
            traces=traces,
            shard=0,
            target=target,
            output=work / f"shard-{backend}.safetensors",
            metadata=work / f"shard-{backend}.json",
            work=work / f"work-{backend}",
        )
        hidden_states = section(
            HiddenStatesSettings,
            {
                "batch_tokens": args.batch_tokens,
                "compute_dtype": "bfloat16",
                "max_seq_len": 2047,  # engine max_model_len 2048 fits the random target's 4096 positions
                "backend": backend,
                "vllm": vllm,
            },
        )
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        start, start_cpu = time.perf_counter(), time.process_time()
        meta = extract.extract_shards(hidden_states, [job])[0]
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = time.process_time() - start_cpu + (after.ru_utime + after.ru_stime)
        cpu -= children.ru_utime + children.ru_stime
        forward_s = None
        if backend == "vllm":
            startup = meta["engine"]["engine_start_s"]
            forward_s = meta["engine"]["last_run"]["extract_s"]  # the engine calls, reads, norm, parts
        else:
            t0 = time.perf_counter()
            capture.load_target(target, torch.bfloat16, torch.device("cpu"), device_map=False)
            startup = time.perf_counter() - t0
        tokens = meta["num_tokens"]
        results[backend] = {
            "measure": "backend_job",
            "backend": backend,
            "tokens": tokens,
            "job_s": round(seconds, 2),
            "startup_s": round(startup, 2),
            "job_tokens_per_s": round(tokens / seconds, 1),
            "tokens_per_s_after_startup": round(tokens / max(seconds - startup, 1e-9), 1),
            "engine_calls_tokens_per_s": round(tokens / forward_s, 1) if forward_s else None,
            "cpu_s_incl_children": round(cpu, 2),
            "bytes_per_token": round(meta["bytes_per_token"], 2),
            "floor_bytes_per_token": meta["floor_bytes_per_token"],
        }
        emit(**results[backend])
    t, v = results["transformers"], results["vllm"]
    emit(
        measure="backend_ratio_vllm_over_transformers",
        job_tokens_per_s=round(v["job_tokens_per_s"] / t["job_tokens_per_s"], 3),
        tokens_per_s_after_startup=round(
            v["tokens_per_s_after_startup"] / t["tokens_per_s_after_startup"], 3
        ),
        bytes_per_token=round(v["bytes_per_token"] / t["bytes_per_token"], 4),
        **_agreement(work / "shard-transformers.safetensors", work / "shard-vllm.safetensors"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--target", type=Path, default=None, help="default: the demo target, else a random Llama"
    )
    parser.add_argument(
        "--random-target", action="store_true", help="a random Llama even if the demo's is built"
    )
    parser.add_argument("--hidden", type=int, default=512, help="random target: hidden size (head_dim 64)")
    parser.add_argument("--layers", type=int, default=8, help="random target: decoder layers")
    parser.add_argument("--vocab", type=int, default=32000, help="random target: vocabulary")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens to extract")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--backends", action="store_true", help="only the vllm-vs-transformers job")
    parser.add_argument("--vllm-python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench_hidden_states_") as tmp:
        work = Path(tmp)
        built = DEMO_TARGET if (DEMO_TARGET / "config.json").exists() and not args.random_target else None
        target = args.target or built
        target = target or random_target(work / "target", args.hidden, args.layers, args.vocab)
        info = plan.target_info(target)
        emit(
            measure="setup",
            target=str(target),
            hidden_size=info.hidden_size,
            num_layers=info.num_layers,
            vocab=info.vocab_size,
            threads=torch.get_num_threads(),
            batch_tokens=args.batch_tokens,
        )
        traces = synthetic_traces(work / "traces.parquet", info.vocab_size, args.tokens)
        rows = sequences.load_trace_rows(traces, 0)
        seqs = [r["prompt_token_ids"] + r["completion_token_ids"] for r in rows]
        if args.backends:
            bench_backends(target, traces, work, args)
            return
        layers = sequences.resolve_layers("auto", info.num_layers)
        bench_forwards(target, seqs, args, layers)
        bench_extract(target, traces, work, args)


if __name__ == "__main__":
    main()
