"""The rerun roles the settings declare (settings.setting), written out: a key moved into or out of a
job's params changes which jobs a config change reruns, so it must show up here as a deliberate change.
And no script builds a section from part of its keys (the rest would silently be the schema's defaults).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from eagle3_pipeline.settings import (
    Batching,
    DatasetSettings,
    DemoSettings,
    DraftSettings,
    GenerationSettings,
    HiddenStatesSettings,
    Lengths,
    QuestionOrder,
    ServerSettings,
    TraceFilters,
    TracesSettings,
    TrainSettings,
    ValidateSettings,
    VllmEngineSettings,
    later_values,
    rerun_keys,
    rerun_params,
    runtime_keys,
    runtime_only,
    whole,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLING = ("max_tokens", "temperature", "top_p", "seed", "top_k", "min_p", "presence_penalty")
SAMPLING += ("frequency_penalty", "repetition_penalty", "extra_body")
# (section, job): the keys its params record, in the order recorded
RECORDED = {
    (DemoSettings, "build_demo_target"): ("family", "port", "fit_seconds", "seed"),
    (ServerSettings, "snapshot_server"): ("host", "unit", "unit_file", "base_url"),
    (ServerSettings, "stop_server"): ("manage", "stop_after_generation", "stop_foreign"),
    (DatasetSettings, "prepare_prompts"): ("path", "seed", "turns"),
    (GenerationSettings, "prepare_prompts"): ("history",),
    (GenerationSettings, "preflight"): (*SAMPLING, "chat_template_kwargs"),
    (GenerationSettings, "generate_shard"): (*SAMPLING, "chat_template_kwargs", "history"),
    (GenerationSettings, "serve_check"): (*SAMPLING, "concurrency", "chat_template_kwargs"),
    (TracesSettings, "filter_traces"): (
        "drop_truncated",
        "drop_empty",
        "drop_duplicates",
        "validation_fraction",
    ),
    (TracesSettings, "merge_traces"): (
        "drop_truncated",
        "drop_empty",
        "drop_duplicates",
        "validation_fraction",
    ),
    (HiddenStatesSettings, "extract_hidden_states"): (
        *("backend", "vllm", "layers", "max_seq_len", "overlong", "dtype", "batch_tokens", "compute_dtype"),
        "trust_remote_code",
    ),
    (VllmEngineSettings, "extract_hidden_states"): (
        *("tensor_parallel_size", "dtype", "quantization", "trust_remote_code", "enable_expert_parallel"),
    ),
    (HiddenStatesSettings, "vocab_map"): ("max_seq_len", "overlong"),
    (HiddenStatesSettings, "plan_windows"): ("max_seq_len", "overlong"),
    (DraftSettings, "vocab_map"): ("draft_vocab_size",),
    (DraftSettings, "train_draft"): tuple(f.name for f in dataclasses.fields(DraftSettings)),
    (TrainSettings, "train_draft"): (
        "epochs",
        "lr",
        "warmup_ratio",
        "weight_decay",
        "grad_clip",
        "batch_tokens",
        "seed",
    ),
    (TrainSettings, "plan_windows"): ("epochs", "batch_tokens", "seed"),
    (ValidateSettings, "serve_check"): (
        *("num_speculative_tokens", "max_questions", "max_tokens", "temperature", "enforce_eager"),
        *("served_offline_tolerance", "by_k_max", "speedup"),
    ),
}
# recorded only while set: keys added after jobs were recorded without them
LATER = {
    DemoSettings: {"family": "llama"},
    GenerationSettings: {
        **dict.fromkeys(("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")),
        "extra_body": {},
        "history": "none",
    },
    DraftSettings: {"norm_before_fc": False, "fc_norm": False, "norm_output": False, "init_from": None},
    ValidateSettings: {"by_k_max": 0},
}
RUNTIME = {
    (TrainSettings, "train_draft"): ("save_every_steps", "activation_checkpointing", "fsdp"),
    (TracesSettings, "merge_traces"): ("max_failed_fraction",),
    (GenerationSettings, "generate_shard"): (
        "concurrency",
        "global_concurrency",
        "retries",
        "request_timeout_s",
    ),
}
# the narrow sections: exactly the keys a job records
NARROW = {
    TraceFilters: (TracesSettings, "filter_traces"),
    Lengths: (HiddenStatesSettings, "vocab_map"),
    Batching: (TrainSettings, "plan_windows"),
    QuestionOrder: (DatasetSettings, "prepare_prompts"),
}


@pytest.mark.parametrize(("where", "keys"), RECORDED.items(), ids=[f"{c.__name__}-{j}" for c, j in RECORDED])
def test_each_job_records_the_keys_it_always_did(where, keys):
    assert rerun_keys(*where) == keys


@pytest.mark.parametrize(("where", "keys"), RUNTIME.items(), ids=[f"{c.__name__}-{j}" for c, j in RUNTIME])
def test_the_run_time_keys_are_the_others(where, keys):
    assert runtime_keys(*where) == keys


def test_the_keys_recorded_only_while_set():
    classes = {
        DemoSettings,
        GenerationSettings,
        DraftSettings,
        ValidateSettings,
        TrainSettings,
        TracesSettings,
    }
    assert {cls: later_values(cls) for cls in classes if later_values(cls)} == LATER


def test_a_later_key_is_left_out_while_unset_null_and_empty_alike():
    draft = DraftSettings()
    assert "init_from" not in rerun_params(draft, "train_draft")
    assert "init_from" not in rerun_params(dataclasses.replace(draft, init_from=""), "train_draft")
    assert rerun_params(dataclasses.replace(draft, init_from="d", fc_norm=True), "train_draft")["fc_norm"]
    # a set value that is falsy still differs from an unset (null) one: top_k 0, presence_penalty 0.0
    generation = GenerationSettings(top_k=0, presence_penalty=0.0)
    assert {"top_k": 0, "presence_penalty": 0.0}.items() <= rerun_params(generation, "generate_shard").items()


@pytest.mark.parametrize("narrow", NARROW, ids=[cls.__name__ for cls in NARROW])
def test_a_narrow_section_holds_exactly_the_keys_its_job_records(narrow):
    assert tuple(f.name for f in dataclasses.fields(narrow)) == rerun_keys(*NARROW[narrow])


def test_whole_refuses_a_partial_section():
    with pytest.raises(TypeError, match=r"TrainSettings lacks \['lr'"):
        whole(TrainSettings, {"epochs": 1, "batch_tokens": 2, "seed": 3})
    with pytest.raises(TypeError, match=r"HiddenStatesSettings.vllm lacks \['python'"):
        whole(
            HiddenStatesSettings,
            {f.name: None for f in dataclasses.fields(HiddenStatesSettings)} | {"vllm": {}},
        )
    # the later keys take their unset value; the rest come from params and run-time values
    recorded = rerun_params(DraftSettings(), "train_draft")
    assert whole(DraftSettings, recorded) == DraftSettings()
    train = TrainSettings(lr=3.0, fsdp=True)
    runtime = runtime_only(train={"save_every_steps": 500, "activation_checkpointing": False, "fsdp": True})
    assert runtime.whole(TrainSettings, "train", rerun_params(train, "train_draft")) == train


def _settings_calls(path: Path) -> list[str]:
    """The calls in a script that build a section leniently (section())."""
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name == "section" and not (isinstance(func, ast.Attribute) and _is_runtime(func)):
                names.append(f"{path.name}:{node.lineno} {name}()")
    return names


def _is_runtime(func: ast.Attribute) -> bool:
    """runtime.section("engine"): a run-time value that is no settings section, read as it is."""
    return func.attr == "section"


def test_no_script_builds_a_section_from_part_of_its_keys():
    """Scripts build their sections with `whole` (every key from params and run-time values) or as a
    narrow section; section() would let a missing key take the schema's default."""
    assert [call for path in sorted((REPO / "scripts").glob("*.py")) for call in _settings_calls(path)] == []
