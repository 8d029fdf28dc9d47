"""GPU check of the vllm backend (issue 22): run it where a CUDA GPU and a CUDA build of vLLM exist.

Not run yet: no GPU was lent to the session that wrote it. Under 8 minutes on one GPU (five engine
starts of a tiny model plus one transformers reference). On a random tiny DeepseekV3 (MLA, sigmoid
MoE with `noaux_tc` and hand-written `e_score_correction_bias`, the Kimi-K2 family's shape) and the
same weights inside a KimiK25-style wrapper config (`KimiK25ForConditionalGeneration`, text_config,
started with language_model_only), through the pipeline's own extraction engine:

  ds-v2-async   the default path on CUDA: Model Runner V2, compiled, vLLM's async connector
  ds-v2-sync    the same with our synchronous connector (hidden_states.vllm.connector: sync)
  ds-v1-async   VLLM_USE_V2_MODEL_RUNNER=0
  kimi-v2-async the wrapper config, default path
  ds-tp2-async  TP 2, when two GPUs are visible

Prints one JSON line per case: the runner and connector the engine recorded, engine start seconds,
tokens/s of the engine (its last_run), the four states of the first token (3 aux + final: norms), and
the cosine (mean, worst token) of each against the transformers backend on the same sequences; then
the async / sync tokens/s ratio.

    .venv/bin/python benchmarks/gpu_check_extraction.py --vllm-python .venv-vllm-gpu/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagle3_pipeline.hidden_states import HiddenStateShard, extract
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.settings import HiddenStatesSettings, section

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from hidden_states import synthetic_traces  # noqa: E402

DEEPSEEK = {  # the smallest shape vllm accepts for MLA (kv_lora_rank + qk_rope_head_dim = 576)
    "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 128,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "max_position_embeddings": 4096,
    "rope_theta": 10000.0, "tie_word_embeddings": False,
}  # fmt: skip


def emit(**record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


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


def extract_once(target: Path, traces: Path, out: Path, backend: str, vllm: dict, args) -> dict:
    out.mkdir(parents=True)
    job = ShardJob(
        traces=traces, shard=0, target=target, output=out / "shard.safetensors", metadata=out / "shard.json",
        work=out / "work",
    )  # fmt: skip
    hidden_states = section(HiddenStatesSettings, {
        "batch_tokens": args.batch_tokens, "max_seq_len": 2047, "backend": backend, "vllm": vllm,
        "compute_dtype": "bfloat16",
    })  # fmt: skip
    start = time.perf_counter()
    meta = extract.extract_shard(hidden_states, job)
    return {"meta": meta, "path": job.output, "job_s": time.perf_counter() - start}


def compare(path: Path, reference: Path) -> dict:
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
    for name, (a, b) in zip(("aux0", "aux1", "aux2", "final"), states, strict=True):
        cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        result[name] = {"mean": round(float(cosine.mean()), 5), "min": round(float(cosine.min()), 5)}
    result["first_token_norms"] = [round(float(a[0].norm()), 3) for a, _ in states]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-python", type=Path, required=True, help="a CUDA build of vLLM 0.32")
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--batch-tokens", type=int, default=16384)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible: this check needs a GPU")
    gpus = torch.cuda.device_count()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = Path(tmp)
        deepseek = deepseek_target(work / "deepseek")
        kimi = kimi_wrapper(deepseek, work / "kimi")
        traces = synthetic_traces(work / "traces.parquet", DEEPSEEK["vocab_size"], args.tokens)
        reference = extract_once(deepseek, traces, work / "transformers", "transformers", {}, args)
        emit(case="transformers", tokens=reference["meta"]["num_tokens"], job_s=round(reference["job_s"], 1))
        base = {"python": str(args.vllm_python), "dtype": "bfloat16", "max_model_len": 2048}
        cases = [
            ("ds-v2-async", deepseek, {"connector": "async"}, {}),
            ("ds-v2-sync", deepseek, {"connector": "sync"}, {}),
            ("ds-v1-async", deepseek, {"connector": "async"}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}),
            ("kimi-v2-async", kimi, {"connector": "async", "trust_remote_code": True}, {}),
        ]
        if gpus >= 2:
            cases.append(("ds-tp2-async", deepseek, {"connector": "async", "tensor_parallel_size": 2}, {}))
        rates = {}
        for name, target, options, env in cases:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                done = extract_once(target, traces, work / name, "vllm", {**base, **options}, args)
            except Exception as err:  # one case's failure is a finding; the others still run
                emit(case=name, error=f"{type(err).__name__}: {err}"[-2000:])
                continue
            finally:
                for key, value in saved.items():
                    os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
            engine = done["meta"]["engine"]
            run = engine["last_run"]
            rates[name] = run["tokens"] / max(run["extract_s"], 1e-9)
            emit(
                case=name, runner=engine["runner"], connector=engine["connector"],
                cudagraph_mode=engine["cudagraph_mode"], language_model_only=engine["language_model_only"],
                start_s=engine["engine_start_s"], tokens=run["tokens"], tokens_per_s=round(rates[name], 1),
                vs_transformers=compare(done["path"], reference["path"]),
            )  # fmt: skip
        if "ds-v2-async" in rates and "ds-v2-sync" in rates:
            emit(
                case="async_over_sync",
                tokens_per_s_ratio=round(rates["ds-v2-async"] / rates["ds-v2-sync"], 3),
            )


if __name__ == "__main__":
    main()
