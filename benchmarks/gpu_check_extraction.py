"""GPU check of the vllm backend's extraction engine as the pipeline runs it (issues 22, 37 and 48).

Run it where CUDA GPUs exist, with one CUDA build of vLLM per supported release (vllm_releases.py:
0.32, 0.33, 0.34), each `--vllm-python` once: every case runs on every release given (the JSON lines
name the release), and the verdict fails naming a supported release no interpreter was given for. It
exits 1 when a case fails a threshold or a release is left unchecked, and 2 when no GPU is visible.
Not run yet: no GPU was lent to the sessions that wrote it (its CPU-safe parts, the arguments, the
releases, the cases and the pass/fail logic, are tested in tests/unit/test_gpu_check_extraction.py).

On a random tiny DeepseekV3 (MLA, sigmoid MoE with `noaux_tc` and hand-written
`e_score_correction_bias`, 8 heads and 8 routed experts so that TP and EP up to 8 divide them: the
Kimi-K2 family's shape) and the same weights inside a KimiK25-style wrapper config
(`KimiK25ForConditionalGeneration`, text_config, started with language_model_only), each case runs
the engine as the pipeline does: the engine job's code (`vllm_extraction.serve_engine`, in a thread)
and one extraction client (`extract.extract_shards` with the engine's folder: join, client slot,
queue, parts, packing), on sequences of `--seq-tokens` (8,192) tokens:

  tp{N}         the default path on CUDA (Model Runner V2, vLLM's async connector) at TP N, for every
                N of 1, 2, 4, 8 up to the visible GPUs
  ep{N}         --enable-expert-parallel at the largest TP (experts split over the N GPUs; N = 1 when
                one GPU is visible: the path runs, the split is trivial)
  tp1-sync      our synchronous connector (hidden_states.vllm.connector: sync)
  tp1-v1        VLLM_USE_V2_MODEL_RUNNER=0 (up to 0.33: 0.34 removed the V1 runner and refuses it)
  kimi-tp{N}    the wrapper config at the largest TP

Each case prints one JSON line: the runner and connector the engine recorded, its start seconds, the
engine's tokens/s (its last_run), its busy fraction over its ready time (its stats record), the peak
GPU memory per device while it ran (nvidia-smi, every 0.5 s) against `--gpu-memory-utilization` of
the device, the cosine (mean, worst token) of each state (3 aux + final) against the transformers
backend on the same sequences, and its verdict against the thresholds:

  cosine      every state's mean >= --min-mean-cosine and worst token >= --min-worst-cosine
  memory      each device's peak, less what was in use before the engine started, <=
              (--gpu-memory-utilization + --memory-margin) x its total
  tokens/s    the engine's tokens/s >= --min-tokens-per-s (20,000 by default: make cost's fast
              figure for Kimi-K2.5 on 8 GPUs; a tiny model far exceeds it unless the engine's own loop,
              connector or writer is the bottleneck)

The last line is the verdict of all cases ({"case": "verdict", "passed": ..., "failures": [...]}).
About 8 engine starts with 8 GPUs (5 with one); minutes each for TP 8.

    .venv/bin/python benchmarks/gpu_check_extraction.py --vllm-python /opt/vllm-0.32/bin/python \
        --vllm-python /opt/vllm-0.33/bin/python --vllm-python /opt/vllm-0.34/bin/python
    .venv/bin/python benchmarks/gpu_check_extraction.py --vllm-python ... --cases tp1 ep8 --tokens 32768
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import torch
from safetensors.torch import load_file, save_file

from eagle3_pipeline import vllm_releases
from eagle3_pipeline.hidden_states import HiddenStateShard, extract
from eagle3_pipeline.hidden_states import engine as engine_service
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.hidden_states.vllm_backend import vllm_version
from eagle3_pipeline.settings import HiddenStatesSettings, section

REPO = Path(__file__).resolve().parent.parent

DEEPSEEK = {  # the smallest shape vllm accepts for MLA (kv_lora_rank + qk_rope_head_dim = 576)
    "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 128,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "max_position_embeddings": 16384,
    "rope_theta": 10000.0, "tie_word_embeddings": False,
}  # fmt: skip
TP_SIZES = (1, 2, 4, 8)  # each divides the tiny model's 8 heads and 8 routed experts
STATES = ("aux0", "aux1", "aux2", "final")


def emit(**record: Any) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------------
# CPU-safe: arguments, cases, thresholds, nvidia-smi's output, the traces


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--vllm-python",
        type=Path,
        action="append",
        required=True,
        help="a CUDA build of vLLM, once per supported release (0.32, 0.33, 0.34)",
    )
    parser.add_argument("--tokens", type=int, default=65536, help="tokens in all (8 sequences of 8,192)")
    parser.add_argument(
        "--seq-tokens", type=int, default=8192, help="each sequence (prompt 512 + completion)"
    )
    parser.add_argument("--batch-tokens", type=int, default=32768, help="hidden_states.batch_tokens")
    parser.add_argument("--cases", nargs="+", help="only these (names as listed in the docstring)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--memory-margin", type=float, default=0.05, help="of the device's total")
    parser.add_argument("--min-mean-cosine", type=float, default=0.999)
    parser.add_argument("--min-worst-cosine", type=float, default=0.95)
    parser.add_argument("--min-tokens-per-s", type=float, default=20000.0)
    args = parser.parse_args(argv)
    if args.seq_tokens <= 512 or args.tokens < args.seq_tokens:
        parser.error("--seq-tokens must exceed the 512-token prompt and --tokens hold one sequence")
    if args.batch_tokens < args.seq_tokens:
        parser.error("--batch-tokens must hold one sequence (--seq-tokens)")
    if not 0 < args.gpu_memory_utilization + args.memory_margin <= 1:
        parser.error("--gpu-memory-utilization plus --memory-margin must be in (0, 1]")
    return args


@dataclass(frozen=True)
class Case:
    name: str
    wrapper: bool  # the KimiK25 wrapper config instead of the plain DeepseekV3
    vllm: dict[str, Any]  # hidden_states.vllm keys of the case
    env: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return int(self.vllm.get("tensor_parallel_size", 1))


def tp_sizes(visible: int) -> list[int]:
    """The TP sizes to check with `visible` GPUs: 1, 2, 4, 8 up to the visible count."""
    return [tp for tp in TP_SIZES if tp <= visible]


def plan_releases(versions: dict[Path, str | None]) -> tuple[dict[str, Path], list[str]]:
    """({release: interpreter}, problems) of the interpreters given, by the vLLM version each has.

    A problem names an interpreter without vLLM, one outside the supported ranges (vllm_releases.py),
    two of one release, and each supported release (major.minor of CHECKED_RELEASES) none was given for.
    """
    chosen: dict[str, Path] = {}
    problems = []
    for python, version in versions.items():
        release = vllm_releases.major_minor(version)
        if release is None:
            problems.append(f"{python}: no vLLM found")
        elif not vllm_releases.RANGES["extract"].contains(version):
            problems.append(f"{python}: vLLM {version} is outside {vllm_releases.RANGES['extract'].spec}")
        elif f"{release[0]}.{release[1]}" in chosen:
            problems.append(f"{python}: a second interpreter of vLLM {release[0]}.{release[1]}")
        else:
            chosen[f"{release[0]}.{release[1]}"] = python
    supported = sorted({".".join(r.split(".")[:2]) for r in vllm_releases.CHECKED_RELEASES})
    problems += [
        f"vLLM {r}: not checked (give --vllm-python of a CUDA build of it)"
        for r in supported
        if r not in chosen
    ]
    return chosen, problems


def release_cases(cases: list[Case], release: str) -> list[Case]:
    """The cases a release runs: a case whose environment the release refuses at start is left out
    (tp1-v1 from 0.34, which removed the V1 runner: vllm_releases.REFUSED_ENV)."""
    return [case for case in cases if not vllm_releases.refused_env(f"{release}.0", case.env)]


def plan_cases(visible: int, only: list[str] | None = None) -> list[Case]:
    """Every case for `visible` GPUs (see the module docstring), or the ones named in `only`.

    Raises:
        ValueError: `only` names a case this machine has not (a TP above its GPUs).
    """
    top = tp_sizes(visible)[-1]
    cases = [
        Case(f"tp{tp}", False, {"connector": "async", "tensor_parallel_size": tp}) for tp in tp_sizes(visible)
    ]
    async_top = {"connector": "async", "tensor_parallel_size": top}
    cases += [
        Case(f"ep{top}", False, {**async_top, "enable_expert_parallel": True}),
        Case("tp1-sync", False, {"connector": "sync", "tensor_parallel_size": 1}),
        Case(
            "tp1-v1",
            False,
            {"connector": "async", "tensor_parallel_size": 1},
            {"VLLM_USE_V2_MODEL_RUNNER": "0"},
        ),
        Case(f"kimi-tp{top}", True, {**async_top, "trust_remote_code": True}),
    ]
    if only:
        names = {case.name for case in cases}
        unknown = [name for name in only if name not in names]
        if unknown:
            raise ValueError(
                f"no case {unknown} with {visible} GPU(s) visible: the cases are {sorted(names)}"
            )
        cases = [case for case in cases if case.name in only]
    return cases


def parse_nvidia_smi(text: str) -> dict[int, tuple[float, float]]:
    """`nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits`:
    {index: (used MiB, total MiB)}."""
    found = {}
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and all(part.replace(".", "", 1).isdigit() for part in parts):
            found[int(parts[0])] = (float(parts[1]), float(parts[2]))
    return found


def failures(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What of one case's result breaks a threshold (empty: it passed). `result` holds `cosine`
    ({state: {mean, min}}), `memory` ({device: {before_mib, peak_mib, total_mib}}) and `tokens_per_s`."""
    found = []
    for state in STATES:
        cosine = (result.get("cosine") or {}).get(state)
        if cosine is None:
            found.append(f"{state}: no cosine measured")
            continue
        if cosine["mean"] < args.min_mean_cosine:
            found.append(f"{state}: mean cosine {cosine['mean']} < {args.min_mean_cosine}")
        if cosine["min"] < args.min_worst_cosine:
            found.append(f"{state}: worst-token cosine {cosine['min']} < {args.min_worst_cosine}")
    allowed = args.gpu_memory_utilization + args.memory_margin
    for device, memory in sorted((result.get("memory") or {}).items()):
        used = memory["peak_mib"] - memory["before_mib"]
        if used > allowed * memory["total_mib"]:
            total = memory["total_mib"]
            found.append(
                f"GPU {device}: the engine used {used:.0f} MiB, over {allowed:.2f} of {total:.0f} MiB"
            )
    if not result.get("memory"):
        found.append("no GPU memory measured (nvidia-smi)")
    rate = result.get("tokens_per_s")
    if rate is None or rate < args.min_tokens_per_s:
        found.append(f"tokens/s {rate} < {args.min_tokens_per_s:.0f}")
    return found


def long_traces(path: Path, vocab: int, tokens: int, seq_tokens: int, seed: int = 0) -> Path:
    """Trace rows of `seq_tokens` tokens each (a 512-token prompt and the completion), `tokens` in all
    (whole sequences, at least one): filter_traces' columns, server-style random ids."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(max(tokens // seq_tokens, 1)):
        ids = torch.randint(0, vocab, (seq_tokens,), generator=g).tolist()
        rows.append(
            {"id": f"g{i:05d}", "shard": 0, "status": "ok", "prompt_token_ids": ids[:512],
             "completion_token_ids": ids[512:]}
        )  # fmt: skip
    schema = {
        "shard": pl.Int32,
        "prompt_token_ids": pl.List(pl.Int32),
        "completion_token_ids": pl.List(pl.Int32),
    }
    pl.DataFrame(rows, schema_overrides=schema).write_parquet(path)
    return path


# --------------------------------------------------------------------------------------------------
# the GPU part


def deepseek_target(directory: Path) -> Path:
    """A random DeepseekV3 with each MoE gate's e_score_correction_bias written into the checkpoint."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(**DEEPSEEK, architectures=["DeepseekV3ForCausalLM"])
    DeepseekV3ForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    weights = directory / "model.safetensors"
    tensors = load_file(weights)
    for layer in range(config.first_k_dense_replace, config.num_hidden_layers):
        key = f"model.layers.{layer}.mlp.gate.e_score_correction_bias"
        tensors.setdefault(key, torch.randn(config.n_routed_experts, dtype=torch.float32) * 0.01)
    save_file(tensors, weights, metadata={"format": "pt"})
    return directory


def kimi_wrapper(source: Path, directory: Path) -> Path:
    """The same weights inside a KimiK25ForConditionalGeneration config (text_config + vision_config)."""
    directory.mkdir(parents=True)
    text = json.loads((source / "config.json").read_text())
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {**text, "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]},
        "vision_config": {"model_type": "kimi_k25_vision"},
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {f"language_model.{k}": v for k, v in load_file(source / "model.safetensors").items()}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


class MemoryWatch:
    """Peak GPU memory per device (nvidia-smi every 0.5 s) while the block runs, beside what was in use
    before it (this process's own CUDA context, the reference run's cache)."""

    def __init__(self) -> None:
        self.before = self._read()
        self.peak = {device: used for device, (used, _) in self.before.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def _read() -> dict[int, tuple[float, float]]:
        if not shutil.which("nvidia-smi"):
            return {}
        query = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
        return parse_nvidia_smi(done.stdout)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            for device, (used, _) in self._read().items():
                self.peak[device] = max(self.peak.get(device, 0.0), used)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def report(self, devices: int) -> dict[int, dict[str, float]]:
        return {
            device: {"before_mib": used, "peak_mib": self.peak.get(device, used), "total_mib": total}
            for device, (used, total) in self.before.items()
            if device < devices
        }


def settings(args: argparse.Namespace, backend: str, vllm: dict[str, Any]) -> HiddenStatesSettings:
    values = {
        "batch_tokens": args.batch_tokens, "max_seq_len": args.seq_tokens, "backend": backend,
        "vllm": vllm, "compute_dtype": "bfloat16",
    }  # fmt: skip
    return section(HiddenStatesSettings, values)


def shard_job(target: Path, traces: Path, out: Path, engine_dir: Path | None = None) -> ShardJob:
    out.mkdir(parents=True)
    return ShardJob(
        traces=traces, shard=0, target=target, output=out / "shard.safetensors", metadata=out / "shard.json",
        work=out / "work", engine_dir=engine_dir,
    )  # fmt: skip


def run_case(
    case: Case, python: Path, target: Path, traces: Path, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The case's engine as its Snakemake job runs it (serve_engine, in a thread, vLLM of `python`) and
    one client."""
    from eagle3_pipeline.hidden_states import vllm_extraction

    vllm = {
        "python": str(python),
        "dtype": "bfloat16",
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
    hidden_states = settings(args, "vllm", {**vllm, **case.vllm})
    engine_dir, records = out / "engine", out / "engine_stats"
    job = shard_job(target, traces, out / "shard", engine_dir)
    saved = {key: os.environ.get(key) for key in case.env}
    os.environ.update(case.env)
    reports: list[dict[str, Any]] = []

    def serve() -> None:
        reports.append(
            vllm_extraction.serve_engine(
                hidden_states, target, None, engine_dir, handle_signals=False, record_dir=records
            )
        )

    try:
        with MemoryWatch() as memory:
            thread = threading.Thread(target=serve)
            thread.start()
            try:
                meta = extract.extract_shards(hidden_states, [job])[0]
            finally:
                deadline = time.monotonic() + 60
                while (
                    not (engine_dir / "process.json").exists()
                    and thread.is_alive()
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.1)
                engine_service.stop_engine(engine_dir)
                thread.join()
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    engine = meta["engine"]
    run = engine["last_run"]
    report = reports[0] if reports else {}
    return {
        "path": job.output, "vllm_version": engine["vllm_version"], "runner": engine["runner"],
        "connector": engine["connector"],
        "tensor_parallel_size": engine["tensor_parallel_size"],
        "enable_expert_parallel": engine["enable_expert_parallel"],
        "language_model_only": engine["language_model_only"], "start_s": engine["engine_start_s"],
        "tokens": run["tokens"], "tokens_per_s": round(run["tokens"] / max(run["extract_s"], 1e-9), 1),
        "busy_fraction": report.get("busy_fraction"), "memory": memory.report(case.gpus),
    }  # fmt: skip


def compare(path: Path, reference: Path) -> dict[str, Any]:
    """Per state (3 aux + final): mean and worst token cosine against the reference shard."""
    with HiddenStateShard(path) as got, HiddenStateShard(reference) as ref:
        h = got.metadata["hidden_size"]
        a_aux = got.tensor_slice("aux_hidden_states", 0, got.num_tokens).float()
        b_aux = ref.tensor_slice("aux_hidden_states", 0, ref.num_tokens).float()
        a_fin = got.tensor_slice("final_hidden_states", 0, got.num_tokens).float()
        b_fin = ref.tensor_slice("final_hidden_states", 0, ref.num_tokens).float()
    states = [(a_aux[:, i * h : (i + 1) * h], b_aux[:, i * h : (i + 1) * h]) for i in range(3)]
    states.append((a_fin, b_fin))
    result = {}
    for name, (a, b) in zip(STATES, states, strict=True):
        cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        result[name] = {"mean": round(float(cosine.mean()), 5), "min": round(float(cosine.min()), 5)}
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device visible: this check needs a GPU", file=sys.stderr)  # noqa: T201
        return 2
    visible = torch.cuda.device_count()
    cases = plan_cases(visible, args.cases)
    releases, uncovered = plan_releases({python: vllm_version(str(python)) for python in args.vllm_python})
    problems: dict[str, list[str]] = {"releases": uncovered} if uncovered else {}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        deepseek = deepseek_target(work / "deepseek")
        kimi = kimi_wrapper(deepseek, work / "kimi")
        traces = long_traces(work / "traces.parquet", DEEPSEEK["vocab_size"], args.tokens, args.seq_tokens)
        start = time.perf_counter()
        job = shard_job(deepseek, traces, work / "transformers")
        meta = extract.extract_shards(settings(args, "transformers", {}), [job])[0]
        emit(case="transformers", tokens=meta["num_tokens"], job_s=round(time.perf_counter() - start, 1))
        reference = job.output
        torch.cuda.empty_cache()
        for release, python in sorted(releases.items()):
            for case in release_cases(cases, release):
                name = f"{release}/{case.name}"
                target = kimi if case.wrapper else deepseek
                try:
                    result = run_case(case, python, target, traces, work / release / case.name, args)
                    result["cosine"] = compare(result.pop("path"), reference)
                except Exception as err:  # one case's failure is a finding; the others still run
                    problems[name] = [f"{type(err).__name__}: {err}"[-2000:]]
                    emit(case=case.name, release=release, passed=False, failures=problems[name])
                    continue
                found = failures(result, args)
                if found:
                    problems[name] = found
                emit(case=case.name, release=release, passed=not found, failures=found, **result)
    ran = {release: [c.name for c in release_cases(cases, release)] for release in sorted(releases)}
    emit(case="verdict", passed=not problems, gpus=visible, releases=ran, failures=problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
