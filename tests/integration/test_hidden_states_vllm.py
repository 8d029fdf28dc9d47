"""The vllm backend against the transformers one on the demo-like target: same states within a measured
tolerance, the same layer numbering, the final state after the final norm, the same file contract.

One real vLLM CPU engine (.venv-vllm) runs for the whole module: both splits of one job, as the rule
runs them. Kept small for 2 CI cores: max_model_len 512, VLLM_CPU_KVCACHE_SPACE=1, enforce_eager.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from support.hidden_states import trace_rows, write_traces
from support.vllm_server import cpu_vllm_env

from eagle3_pipeline.hidden_states import HiddenStateShard, extract, final_norm, vllm_extraction
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.hidden_states.vllm_backend import VllmBackendError
from eagle3_pipeline.settings import HiddenStatesSettings, section

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ENGINE = {"python": str(VLLM_PYTHON), "dtype": "bfloat16", "max_model_len": 512, "enforce_eager": True}
# Measured here (bf16 engine vs bf16 transformers, per aux layer or final state, on the fitted demo
# target): per sample relative error 0.5-0.6% (aux) and 1.0-1.3% (final); per token, cosine 0.99998 /
# 0.99995 on average, the worst token 0.9992 / 0.9989 (this test's traces) and 0.997 / 0.992 over the
# benchmark's 8,192 random-id tokens; the random tiny target stays above 0.9995. The worst token moves
# between runs (vLLM's CPU kernels are not bit-stable across batch shapes). Another aux layer is >= 17%
# off, so the numbering check has a wide margin.
MIN_MEAN_COSINE = 0.9995
MIN_COSINE = 0.98
MAX_RELATIVE = 0.03


@pytest.fixture(scope="module")
def cpu_env() -> None:
    patch = pytest.MonkeyPatch()
    for name, value in cpu_vllm_env().items():
        patch.setenv(name, value)
    yield
    patch.undo()


def _settings(backend: str, **vllm) -> HiddenStatesSettings:
    values = {"batch_tokens": 200, "backend": backend, "vllm": {**ENGINE, **vllm}, "max_seq_len": 400}
    return section(HiddenStatesSettings, values)


def _jobs(traces: dict[str, Path], target: Path, out: Path) -> list[ShardJob]:
    jobs = []
    for split, path in traces.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        jobs.append(ShardJob(
            traces=path, shard=0, target=target, work=out / "work" / split,
            output=out / split / "shard-00000.safetensors", metadata=out / split / "shard-00000.json",
        ))  # fmt: skip
    return jobs


@pytest.fixture(scope="module")
def both(hs_target, hs_tokenizer, tmp_path_factory, cpu_env):
    """Shard 0 of train and validation through each backend: {backend: (jobs, metas, seconds)}."""
    root = tmp_path_factory.mktemp("hs_vllm")
    rows = trace_rows(hs_tokenizer, 7, shard=0)
    traces = {
        "train": write_traces(root / "train.parquet", rows[:5]),
        "validation": write_traces(root / "validation.parquet", rows[5:]),
    }
    done = {}
    for backend in ("transformers", "vllm"):
        jobs = _jobs(traces, hs_target, root / backend)
        start = time.perf_counter()
        if backend == "vllm":  # parts kept: the resume test packs them again without an engine
            metas = vllm_extraction.extract_shards(_settings(backend), jobs, keep_work=True)
        else:
            metas = extract.extract_shards(_settings(backend), jobs, _state())
        done[backend] = (jobs, metas, time.perf_counter() - start)
    return done


def _state():
    from accelerate import PartialState

    return PartialState(cpu=True)


def _pairs(both, split: int = 0):
    with (
        HiddenStateShard(both["transformers"][0][split].output) as ref,
        HiddenStateShard(both["vllm"][0][split].output) as got,
    ):
        yield from zip(list(ref), list(got), strict=True)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _assert_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """[T, H] states: per-token cosine (mean and worst) and the relative error of the whole."""
    cosine = _cosine(got, ref)
    assert cosine.mean() > MIN_MEAN_COSINE and cosine.min() > MIN_COSINE, cosine
    assert _relative(got, ref) < MAX_RELATIVE


def test_both_backends_give_the_same_aux_states_and_layer_numbering(both):
    ref_meta, got_meta = both["transformers"][1][0], both["vllm"][1][0]
    for key in ("aux_layers", "aux_layers_vllm", "num_hidden_layers", "hidden_size", "ids", "num_tokens"):
        assert got_meta[key] == ref_meta[key], key
    assert got_meta["engine"]["layer_ids"] == [*ref_meta["aux_layers_vllm"], ref_meta["num_hidden_layers"]]
    h = ref_meta["hidden_size"]
    for ref, got in _pairs(both):
        assert torch.equal(ref["input_ids"], got["input_ids"]) and torch.equal(
            ref["loss_mask"], got["loss_mask"]
        )
        _assert_close(got["aux_hidden_states"].reshape(-1, h), ref["aux_hidden_states"].reshape(-1, h))
        # numbering: vLLM's slot j is transformers' layer j, not a neighbour
        for j in range(3):
            mine = got["aux_hidden_states"][:, j * h : (j + 1) * h]
            for k in range(3):
                theirs = ref["aux_hidden_states"][:, k * h : (k + 1) * h]
                assert (_relative(mine, theirs) < MAX_RELATIVE) == (j == k)


def test_final_state_is_the_transformers_post_norm_state(both, hs_target):
    norm = final_norm.find_final_norm(hs_target)
    weight = final_norm.load_weight(norm)
    for ref, got in _pairs(both):
        _assert_close(got["final_hidden_states"], ref["final_hidden_states"])
        # and it is post-norm: divided by the norm's weight, every row has an RMS of 1
        rms = (got["final_hidden_states"].float() / weight.float()).pow(2).mean(-1).sqrt()
        assert (rms - 1).abs().max() < 0.02, rms
    meta = both["vllm"][1][0]
    assert meta["final_state"] == "post_norm" and "model.norm.weight" in meta["final_state_source"]


def test_vllm_shards_keep_the_contract_and_say_which_backend(both):
    for ref_meta, got_meta, job in zip(
        both["transformers"][1], both["vllm"][1], both["vllm"][0], strict=True
    ):
        assert set(got_meta) - set(ref_meta) == {"engine"}
        assert got_meta["backend"] == "vllm" and ref_meta["backend"] == "transformers"
        assert got_meta["compute_dtype"] == "bfloat16" and got_meta["engine"]["enforce_eager"] is True
        assert got_meta["engine"]["max_model_len"] == 512 and got_meta["engine"]["vllm_version"]
        assert json.loads(job.metadata.read_text()) == got_meta
        with HiddenStateShard(job.output) as shard:
            assert shard.metadata["backend"] == "vllm"


def test_a_rerun_over_saved_parts_starts_no_engine(both):
    """Resume: with every part saved (a job killed while packing), the rerun packs without vLLM; a
    bogus interpreter proves no engine is started. The work folders go once every split is written."""
    jobs = both["vllm"][0]
    before = [job.output.read_bytes() for job in jobs]
    for job in jobs:
        job.output.unlink()
        job.metadata.unlink()
    metas = extract.extract_shards(_settings("vllm", python="/nonexistent/python"), jobs)
    assert metas == both["vllm"][1]
    assert [job.output.read_bytes() for job in jobs] == before
    assert not any(job.work.exists() for job in jobs)


def test_an_architecture_vllm_cannot_run_names_the_transformers_backend(
    hs_target, hs_tokenizer, tmp_path, cpu_env
):
    target = tmp_path / "target"
    shutil.copytree(hs_target, target)
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (target / "config.json").write_text(json.dumps(config))
    traces = write_traces(tmp_path / "train.parquet", trace_rows(hs_tokenizer, 1, shard=0))
    jobs = _jobs({"train": traces}, target, tmp_path / "out")
    with pytest.raises(VllmBackendError, match=r"hidden_states\.backend: transformers") as refused:
        extract.extract_shards(_settings("vllm"), jobs)
    # the engine's own error, from its log's tail, in the job's error
    assert "vLLM 0.32.0 has no model for ['NoSuchModelForCausalLM']" in str(refused.value), refused.value
