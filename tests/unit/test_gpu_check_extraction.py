"""benchmarks/gpu_check_extraction.py's CPU-safe parts (issue 37, item 6): it imports without a GPU, its
arguments, the cases it plans for the GPUs visible (TP up to them, an expert-parallel case), the
pass/fail thresholds on cosine, memory and tokens/s, nvidia-smi's output, and its 8k-token traces.
The check itself needs CUDA GPUs and a CUDA build of vLLM (docs/hidden_states.md says how to run it)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_check_extraction as check  # noqa: E402


def _args(*extra: str):
    return check.parse_args(["--vllm-python", "/opt/vllm/bin/python", *extra])


def test_defaults_are_8k_token_sequences_and_the_stated_thresholds():
    args = _args()
    assert (args.seq_tokens, args.tokens, args.batch_tokens) == (8192, 65536, 32768)
    assert (args.min_mean_cosine, args.min_worst_cosine, args.min_tokens_per_s) == (0.999, 0.95, 20000.0)
    assert (args.gpu_memory_utilization, args.memory_margin) == (0.5, 0.05)


@pytest.mark.parametrize(
    "bad",
    [
        ["--seq-tokens", "512"],
        ["--tokens", "4096"],
        ["--batch-tokens", "4096"],
        ["--gpu-memory-utilization", "0.99"],
    ],
)
def test_arguments_that_cannot_run_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        _args(*bad)
    assert "error:" in capsys.readouterr().err


def test_tp_goes_up_to_the_visible_gpus_and_expert_parallel_runs_at_the_largest():
    assert check.tp_sizes(1) == [1] and check.tp_sizes(6) == [1, 2, 4] and check.tp_sizes(16) == [1, 2, 4, 8]
    names = [case.name for case in check.plan_cases(8)]
    assert names == ["tp1", "tp2", "tp4", "tp8", "ep8", "tp1-sync", "tp1-v1", "kimi-tp8"]
    ep = check.plan_cases(8, ["ep8"])[0]
    assert ep.vllm["enable_expert_parallel"] and ep.gpus == 8 and not ep.wrapper
    assert [case.name for case in check.plan_cases(1)] == ["tp1", "ep1", "tp1-sync", "tp1-v1", "kimi-tp1"]
    assert check.plan_cases(1, ["tp1-v1"])[0].env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    with pytest.raises(ValueError, match="no case \\['tp8'\\] with 2 GPU"):
        check.plan_cases(2, ["tp8"])
    # the tiny model's heads and routed experts divide every TP and EP size checked
    for tp in check.TP_SIZES:
        assert (
            check.DEEPSEEK["num_attention_heads"] % tp == 0 and check.DEEPSEEK["n_routed_experts"] % tp == 0
        )


def _result(**changes):
    result = {
        "cosine": {state: {"mean": 0.9999, "min": 0.99} for state in check.STATES},
        "memory": {0: {"before_mib": 500.0, "peak_mib": 40000.0, "total_mib": 81559.0}},
        "tokens_per_s": 150000.0,
    }
    return result | changes


def test_a_case_passes_within_every_threshold_and_each_breach_is_named():
    args = _args()
    assert check.failures(_result(), args) == []
    cosine = _result()["cosine"] | {"aux1": {"mean": 0.998, "min": 0.9}}
    assert check.failures(_result(cosine=cosine), args) == [
        "aux1: mean cosine 0.998 < 0.999",
        "aux1: worst-token cosine 0.9 < 0.95",
    ]
    # memory: what the engine added over what was in use before, against utilization + margin
    over = {0: {"before_mib": 500.0, "peak_mib": 46000.0, "total_mib": 81559.0}}  # 45,500 > 0.55 x 81,559
    assert check.failures(_result(memory=over), args) == [
        "GPU 0: the engine used 45500 MiB, over 0.55 of 81559 MiB"
    ]
    assert check.failures(_result(memory={}), args) == ["no GPU memory measured (nvidia-smi)"]
    assert check.failures(_result(tokens_per_s=12000.0), args) == ["tokens/s 12000.0 < 20000"]
    assert check.failures(_result(tokens_per_s=12000.0), _args("--min-tokens-per-s", "10000")) == []
    missing = {state: v for state, v in _result()["cosine"].items() if state != "final"}
    assert check.failures(_result(cosine=missing), args) == ["final: no cosine measured"]


def test_nvidia_smi_lines_are_read_per_device():
    text = "0, 1234, 81559\n1, 80000, 81559\n\nNo devices were found\n"
    assert check.parse_nvidia_smi(text) == {0: (1234.0, 81559.0), 1: (80000.0, 81559.0)}


def test_the_traces_are_8k_token_sequences_of_a_512_token_prompt(tmp_path):
    path = check.long_traces(tmp_path / "t.parquet", 4096, 3 * 8192 + 100, 8192)
    frame = pl.read_parquet(path)
    assert frame.height == 3 and set(frame["status"]) == {"ok"} and set(frame["shard"]) == {0}
    assert frame["prompt_token_ids"].list.len().to_list() == [512] * 3
    assert frame["completion_token_ids"].list.len().to_list() == [8192 - 512] * 3


def test_without_a_gpu_it_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(check.torch.cuda, "is_available", lambda: False)
    assert check.main(["--vllm-python", "/opt/vllm/bin/python"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_every_supported_release_is_checked_or_named_unchecked():
    given = {Path("/a/python"): "0.32.0", Path("/b/python"): "0.34.0", Path("/c/python"): "0.34.1"}
    releases, problems = check.plan_releases(given | {Path("/d/python"): None, Path("/e/python"): "0.35.0"})
    assert releases == {"0.32": Path("/a/python"), "0.34": Path("/b/python")}
    assert problems == [
        "/c/python: a second interpreter of vLLM 0.34",
        "/d/python: no vLLM found",
        "/e/python: vLLM 0.35.0 is outside >=0.32,<0.35",
        "vLLM 0.33: not checked (give --vllm-python of a CUDA build of it)",
    ]


def test_the_v1_runner_case_runs_only_on_releases_that_have_it():
    cases = check.plan_cases(1)
    assert "tp1-v1" in [case.name for case in check.release_cases(cases, "0.33")]
    assert [case.name for case in check.release_cases(cases, "0.34")] == [
        "tp1",
        "ep1",
        "tp1-sync",
        "kimi-tp1",
    ]


def test_an_interpreter_is_given_once_per_release():
    args = _args("--vllm-python", "/opt/vllm-0.33/bin/python")
    assert args.vllm_python == [Path("/opt/vllm/bin/python"), Path("/opt/vllm-0.33/bin/python")]
