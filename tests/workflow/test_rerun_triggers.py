"""Which config keys rerun which jobs, through Snakemake's own records of a finished run.

Every output of the demo DAG is created and `snakemake --touch` records it as done (its params, its
input set, its code), exactly what a real run leaves in .snakemake/metadata; then one key is changed
and `snakemake -n` plans what it would rerun. Runtime-only knobs (timeouts, concurrency caps) plan
nothing, train's too (TRAIN_RUNTIME_KEYS), while every other key of the train and draft sections, read
from the settings' fields and changed to a value the schema admits, retrains the main draft and the
baseline in the same run; a rerun extraction, forced or for a changed param, is planned with its
engine job; toggling
validate.baseline replans only the report (its inputs change), never the main serve check (which
restarts the production unit); a key that shapes an output reruns from there (the control that shows the
params are recorded at all). The same records, touched again by the scheduler on two cores, show the
order it really takes: the main serve check alone, before the baseline's engine.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from support.workflow import DEMO_CONFIG, job_counts, merge, snakemake

from eagle3_pipeline.config import ConfigError, check_config
from eagle3_pipeline.draft_config import SERVED_HEAD_DIMS, attention_shape
from eagle3_pipeline.settings import (
    DRAFT_ATTENTION_KEYS,
    TRAIN_RUNTIME_KEYS,
    DraftSettings,
    TrainSettings,
)
from eagle3_pipeline.target_shape import DEMO_TARGET_SHAPE

REPO = Path(__file__).resolve().parents[2]
BASELINE_WORK = "results/demo/work/baseline/"
SCHEMA = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())

# The sections that shape the trained draft, every key from the settings' fields (a key added later is
# covered with no change here): each reruns training, but the run-time ones (rules/train.smk).
TRAINING_KEYS = [
    (name, f.name)
    for name, cls in (("train", TrainSettings), ("draft", DraftSettings))
    for f in dataclasses.fields(cls)
]
RUNTIME_KEYS = [("train", key) for key in TRAIN_RUNTIME_KEYS]
WEIGHTS_KEYS = [k for k in TRAINING_KEYS if k not in RUNTIME_KEYS]
MAIN_TRAINED = "results/demo/draft/trained/history.json"
BASELINE_TRAINED = "results/demo/baseline/draft/trained/history.json"
# Values a key's schema cannot choose, the demo target's (DEMO_TARGET_SHAPE) instead: the draft vocabulary
# is capped at the target's (above it, the same draft), and the attention's shape (null: the target's,
# 2 heads of 64) must be one the target takes. A key with no override gets a value from its schema
# (_changed_values); one with neither fails its test.
SHAPE_OVERRIDES = {
    "draft_vocab_size": DEMO_TARGET_SHAPE["vocab_size"] // 2,
    "head_dim": next(d for d in SERVED_HEAD_DIMS if d != DEMO_TARGET_SHAPE["head_dim"]),
    "num_attention_heads": 2 * DEMO_TARGET_SHAPE["num_attention_heads"],
    "num_key_value_heads": 1,
}
OVERRIDES = {("draft", key): value for key, value in SHAPE_OVERRIDES.items()}
# a starting draft's folder (draft.init_from), made in the workdir: a plan needs its files, not their bytes
STARTING_DRAFT = "starting-draft"
OVERRIDES["draft", "init_from"] = STARTING_DRAFT


def _snakemake(workdir: Path, *args: str) -> str:
    command = ["--snakefile", str(REPO / "Snakefile"), "--cores", "1", "--configfile", "c.yaml", *args]
    result = snakemake(*command, cwd=workdir, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _config(**sections: Any) -> dict[str, Any]:
    # the learning curve off: its points wait on the last extraction engine to stop (the baseline's when
    # it is on), so toggling the baseline replans them (docs/validation.md); the main draft's never
    demo = merge(yaml.safe_load(DEMO_CONFIG.read_text()), {"validate": {"learning_curve": []}})
    return merge(demo, sections)


def _configure(workdir: Path, **sections: Any) -> None:
    (workdir / "c.yaml").write_text(yaml.safe_dump(_config(**sections), sort_keys=False))


def _planned(workdir: Path) -> dict[str, int]:
    out = _snakemake(workdir, "-n", "--quiet", "rules")
    return {} if "Nothing to be done" in out else dict(job_counts(out))


def _scheduled_rounds(log: str) -> list[list[dict[str, str]]]:
    """A run's jobs as the scheduler selected them: one list per 'Execute N jobs...' round, each job its
    rule, output and resources line as logged (a group's jobs indented)."""
    rounds: list[list[dict[str, str]]] = []
    for block in re.split(r"^Execute \d+ jobs\.\.\.$", log, flags=re.MULTILINE)[1:]:
        jobs = re.findall(
            r"^ *(?:local)?rule (\w+):\n(?: .*\n)*? +output: (.+)\n(?: .*\n)*? +resources: (.+)$",
            block.split("Select jobs to execute...")[0],
            re.MULTILINE,
        )
        rounds.append([{"rule": r, "output": o, "resources": res} for r, o, res in jobs])
    return rounds


def _planned_outputs(plan: str) -> list[str]:
    return [f for line in re.findall(r"^\s+output: (.+)$", plan, re.MULTILINE) for f in line.split(", ")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A workdir whose demo run is recorded as finished (every output present, metadata written)."""
    workdir = tmp_path_factory.mktemp("recorded")
    (workdir / "config").symlink_to(REPO / "config")
    _configure(workdir)
    outputs = _planned_outputs(_snakemake(workdir, "-n"))  # every job's block, its outputs listed
    assert "results/demo/baseline/validation/serve_check.json" in outputs
    for name in outputs:
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    # read when the workflow is parsed and when it starts (the disk budget's figures)
    target = {"hidden_size": 128, "num_hidden_layers": 8, "vocab_size": 1024, "model_type": "llama"}
    (workdir / "resources/demo/target/config.json").write_text(json.dumps(target))
    _snakemake(workdir, "--touch", "--forceall")  # every job, in DAG order: each one's record written
    assert _planned(workdir) == {}
    assert "missing provenance" not in _snakemake(workdir, "-n")
    return workdir


@pytest.mark.parametrize(
    "sections",
    [
        {"generation": {"global_concurrency": 8}},
        {"generation": {"retries": 2, "request_timeout_s": 60}},
        {"server": {"start_timeout_s": 60, "stop_timeout_s": 30, "ssh": {"connect_timeout_s": 3}}},
        {"validate": {"remote_dir": "/srv/drafts"}},
        {"traces": {"max_failed_fraction": 0.2}},  # raised after a refused merge
    ],
    ids=[
        "global_concurrency",
        "pacing",
        "server_timeouts",
        "remote_dir",
        "max_failed_fraction",
    ],
)
def test_runtime_knobs_rerun_nothing(finished, sections):
    _configure(finished, **sections)
    assert _planned(finished) == {}


def _changed_values(name: str, key: str) -> list[Any]:
    """Values of `name.key` other than the demo config's that its schema property admits, likeliest
    first: the override, else the enum's others, the bool flipped, the number doubled, halved, plus or
    minus one. None at all for a null (derived from the target) with no override."""
    prop = SCHEMA["properties"][name]["properties"][key]
    current = _config()[name].get(key, prop.get("default"))
    if (name, key) in OVERRIDES:
        candidates = [OVERRIDES[name, key]]
    elif "enum" in prop:
        candidates = list(prop["enum"])
    elif isinstance(current, bool):
        candidates = [not current]
    elif isinstance(current, int | float):
        half = current // 2 if isinstance(current, int) else current / 2
        candidates = [current * 2, half, current + 1, current - 1]
    else:
        candidates = []
    admits = jsonschema.Draft202012Validator(prop).is_valid
    return [v for v in candidates if v != current and admits(v)]


def _change(workdir: Path, name: str, key: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Configure `workdir` with `name.key` changed to the first value the whole config check takes
    (its cross-key rules too, e.g. train.batch_tokens >= hidden_states.max_seq_len); the value."""
    monkeypatch.chdir(workdir)  # where the config's relative paths (dataset, target) resolve
    if (name, key) == ("draft", "init_from"):
        (workdir / STARTING_DRAFT).mkdir(exist_ok=True)
        for file in ("config.json", "model.safetensors"):
            (workdir / STARTING_DRAFT / file).write_text("{}")
    for value in _changed_values(name, key):
        try:
            check_config(_config(**{name: {key: value}}), REPO / "config" / "schema.yaml")
        except ConfigError:
            continue
        if key in DRAFT_ATTENTION_KEYS:  # a shape the demo target takes (ValueError if not), not its own
            assert attention_shape(DEMO_TARGET_SHAPE, **{key: value}) != attention_shape(DEMO_TARGET_SHAPE)
        _configure(workdir, **{name: {key: value}})
        return value
    pytest.fail(f"no valid value other than the demo's for {name}.{key}: add one to OVERRIDES")


@pytest.mark.parametrize(("name", "key"), WEIGHTS_KEYS, ids=[key for _, key in WEIGHTS_KEYS])
def test_a_key_that_shapes_the_weights_reruns_training(finished, name, key, monkeypatch):
    value = _change(finished, name, key, monkeypatch)
    assert MAIN_TRAINED in _planned_outputs(_snakemake(finished, "-n")), f"{name}.{key}: {value!r}"


# The main draft retrained reruns its offline validation, which the baseline's extraction waits on through
# an ancient input (get_baseline_extraction_gate). Snakemake (9.27, dag.update_needrun) never checks a
# job downstream of one that reruns, expecting to reach it from there, yet stops at an ancient input
# that exists (snakemake/snakemake#4166): the Snakefile's fix (snakemake_ancient_fix) checks such a job
# on its own, so the baseline retrains in the same run, and nothing behind the gate reruns for it alone.
def test_a_key_that_shapes_the_weights_retrains_the_baseline_in_the_same_run(finished, monkeypatch):
    _change(finished, "train", "lr", monkeypatch)
    outputs = _planned_outputs(_snakemake(finished, "-n"))
    assert BASELINE_TRAINED in outputs and MAIN_TRAINED in outputs
    assert not [f for f in outputs if f.startswith("results/demo/baseline/hidden_states/")]


@pytest.mark.parametrize(("name", "key"), RUNTIME_KEYS, ids=[key for _, key in RUNTIME_KEYS])
def test_a_training_runtime_key_reruns_nothing(finished, name, key, monkeypatch):
    value = _change(finished, name, key, monkeypatch)
    assert _planned(finished) == {}, f"{name}.{key}: {value!r}"


# hidden_states.vllm keys that never change the states' bytes (vllm_backend.RUNTIME_KEYS): memory,
# CUDA graphs / eager mode, the connector, the interpreter, the engine's sizing; all changed at once
# plan nothing (one dry run: each key's part of the fingerprint is unit-tested, test_hidden_states_rerun_keys)
ENGINE_RUNTIME_CHANGES = {
    "gpu_memory_utilization": 0.5,  # lowered after an out-of-memory crash
    "enforce_eager": False,
    "cuda_graphs": True,
    "connector": "sync",
    "python": "/opt/vllm/bin/python",
    "max_num_batched_tokens": 4096,
}


def test_the_engine_run_time_keys_rerun_no_extraction(finished):
    _configure(finished, hidden_states={"vllm": ENGINE_RUNTIME_CHANGES})
    assert _planned(finished) == {}


def test_an_engine_key_that_changes_the_bytes_reruns_extraction_on_its_engine(finished):
    # the control: the vllm section's recorded keys are still triggers (bf16 served, fp16 here); the
    # shards rerun for a changed param, their outputs there, yet in their engine's group
    _configure(finished, hidden_states={"vllm": {"dtype": "float16"}})
    planned = _planned(finished)
    assert planned["extract_hidden_states"] == planned["baseline_extract_hidden_states"] == 4
    assert planned["serve_extraction_engine"] == planned["baseline_serve_extraction_engine"] == 1


def test_a_forced_extraction_is_planned_with_its_engine(finished):
    # issue 50: a rerun Snakemake plans for another reason than a missing output (--forcerun, a changed
    # param or script) runs on its scope's engine job, never alone starting an engine of its own
    _configure(finished)
    planned = dict(
        job_counts(_snakemake(finished, "-n", "--quiet", "rules", "--forcerun", "extract_hidden_states"))
    )
    assert planned["extract_hidden_states"] == 4 and planned["serve_extraction_engine"] == 1
    # the baseline's extraction is another rule, not forced: its engine stays unplanned
    assert (
        "baseline_serve_extraction_engine" not in planned and "baseline_extract_hidden_states" not in planned
    )


def test_one_forced_shard_is_planned_alone_with_its_engine(finished):
    _configure(finished)
    state = "results/demo/hidden_states/train/shard-00002.safetensors"
    planned = dict(job_counts(_snakemake(finished, "-n", "--quiet", "rules", "--forcerun", state)))
    assert planned["extract_hidden_states"] == 1 and planned["serve_extraction_engine"] == 1


def test_a_dry_run_over_a_finished_run_forced_whole_plans_every_engine(finished):
    _configure(finished)
    planned = dict(job_counts(_snakemake(finished, "-n", "--quiet", "rules", "--forceall")))
    assert planned["serve_extraction_engine"] == planned["baseline_serve_extraction_engine"] == 1
    assert planned["extract_hidden_states"] == planned["baseline_extract_hidden_states"] == 4


def test_concurrency_reruns_no_generation_only_the_measured_serve_checks(finished):
    _configure(finished, generation={"concurrency": 4})  # the checks' tokens/s are measured at it
    assert _planned(finished) == {"serve_check": 2, "plot_validation": 1, "all": 1}


def test_turning_the_baseline_off_reruns_no_main_job(finished):
    # the baseline's extraction engine is a job of its own: the main one's inputs stay the same
    _configure(finished, validate={"baseline": False})
    assert _planned(finished) == {"plot_validation": 1, "all": 1}  # the report loses the baseline


def test_turning_the_baseline_on_plans_baseline_jobs_only(finished):
    _configure(finished, validate={"baseline": False})
    _snakemake(finished, "--touch")  # a run recorded without the baseline, none of its files there
    baseline, aside = finished / "results/demo/baseline", finished / "baseline-aside"
    baseline.rename(aside)
    try:
        _configure(finished)
        plan = _snakemake(finished, "-n")
        outputs = _planned_outputs(plan)
        main = [f for f in outputs if not f.startswith(("results/demo/baseline/", BASELINE_WORK))]
        assert main and all(f.startswith("results/demo/report/") for f in main), main  # the report gains it
        assert "baseline_extract_hidden_states" in plan and "baseline_serve_extraction_engine" in plan
    finally:
        aside.rename(baseline)
        _configure(finished)
        _snakemake(finished, "--touch")  # recorded with the baseline again, for the other tests
    assert _planned(finished) == {}


def test_a_serve_check_key_reruns_both_checks_and_the_report_only(finished):
    _configure(finished, validate={"max_questions": 8})
    assert _planned(finished) == {"serve_check": 2, "plot_validation": 1, "all": 1}


def test_the_speedup_key_reruns_the_main_check_only(finished):
    # the baseline's check never times the target alone (the same run as the main draft's)
    _configure(finished, validate={"speedup": False})
    planned = _planned(finished)
    assert planned == {"serve_check": 1, "plot_validation": 1, "all": 1}, planned
    outputs = _planned_outputs(_snakemake(finished, "-n"))
    assert "results/demo/validation/serve_check.json" in outputs
    assert "results/demo/baseline/validation/serve_check.json" not in outputs


def test_a_sampling_key_reruns_generation(finished):
    _configure(finished, generation={"max_tokens": 256})
    planned = _planned(finished)
    assert planned["generate_shard"] == 4 and planned["preflight_generation"] == 1
    assert planned["serve_check"] == 2  # the checks send the same sampling


def test_a_filter_key_reruns_the_filters_and_the_merge(finished):
    _configure(finished, traces={"drop_truncated": True})
    planned = _planned(finished)
    assert planned["filter_traces"] == 4 and planned["merge_traces"] == 1
    assert "generate_shard" not in planned


def test_the_main_serve_check_runs_alone_before_the_baselines_engine(finished):
    # The baseline's extraction becomes ready with the main serve check (both wait for the main offline
    # validation): the scheduler, on the demo's two cores and its profile's resources, must start the
    # check first and alone, and nothing of the baseline's engine or GPU jobs until it is done. --touch
    # runs every job through the real scheduler, in no time: a job's round is its start.
    _configure(finished)
    command = ["--snakefile", str(REPO / "Snakefile"), "--cores", "2", "--configfile", "c.yaml"]
    result = snakemake(*command, "--touch", "--forceall", cwd=finished, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = _scheduled_rounds(result.stderr)
    blocks = re.findall(r"^ *(?:local)?rule \w+:$", result.stderr, re.MULTILINE)
    assert sum(map(len, rounds)) == len(blocks) - 1 > 40  # every job parsed but `all` (no output)
    starts = {f: i for i, jobs in enumerate(rounds) for job in jobs for f in job["output"].split(", ")}
    check = starts["results/demo/validation/serve_check.json"]
    # alone in its round: the baseline's extraction jobs are one group with their engine job (every one
    # of them consumes it), which holds the engine slot and every GPU
    (job,) = rounds[check]
    assert job["rule"] == "serve_check"
    # while it runs, no extraction engine job (its one slot held) nor GPU job can start
    assert job["resources"].endswith("draft_server=1, extraction_engines=1, gpu=1"), job
    baseline = [f for f in starts if f.startswith(("results/demo/baseline/hidden_states/", BASELINE_WORK))]
    trained = ("draft/trained/history.json", "validation/offline.json")
    baseline += [f"results/demo/baseline/{f}" for f in trained]
    # 4 shards' states and metadata, the engine job's service() output and the trained files
    engines = [j for r in rounds for j in r if j["rule"] == "baseline_serve_extraction_engine"]
    assert len(engines) == 1 and len(baseline) == 4 * 2 + 1 + 2, baseline
    assert all(starts[f] > check for f in baseline), {f: starts[f] for f in baseline} | {"check": check}
    assert starts["results/demo/validation/offline.json"] < check
