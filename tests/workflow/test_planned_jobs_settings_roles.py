"""The planned jobs' params against the settings' declared rerun roles (settings.setting): each section
param a rule records is what the declarations give for its job, and every section a job receives (its
params and its run-time values) is whole, so that no script works from a section whose missing keys took
the schema's default. A wrong role, or a rule passing a hand-made key list, fails here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.workflow import REPO, planned_jobs, write_config

from eagle3_pipeline.config import check_config
from eagle3_pipeline.generate.payload import sampling_params, serve_check_params
from eagle3_pipeline.settings import (
    Batching,
    DemoSettings,
    DraftSettings,
    Lengths,
    QuestionOrder,
    RuntimeOnly,
    Settings,
    TraceFilters,
    build_settings,
    rerun_keys,
    rerun_params,
    runtime_params,
    whole,
)

# keys recorded only while set, set: their params appear (and generation.history own reaches the selection)
SET = {
    "generation": {"top_k": 20, "extra_body": {"x": 1}, "history": "own"},
    "draft": {"fc_norm": True},
    "validate": {"by_k_max": 2},
}
CAPPED = {"hidden_states": {"max_disk_gb": 0.25}, "train": {"epochs": 3}, "validate": {"baseline": False}}
# the rules whose declared job (settings.setting's `reruns`) has another name
JOB = {
    "preflight_generation": "preflight",
    "preflight_replicas": "preflight",
    "train_draft_window": "train_draft",
    "validate_offline_init": "train_draft",
    "baseline_extract_hidden_states": "extract_hidden_states",
}
SECTIONS = {f.name for f in dataclasses.fields(Settings)}
# rules that record a section's keys each as a param of its own
SPREAD = {
    "extract_hidden_states": "hidden_states",
    "baseline_extract_hidden_states": "hidden_states",
    "vocab_map": "draft",
    "build_demo_target": "demo",
}
# run-time values named like a section that are no settings (plan_windows' shard ids)
NOT_SETTINGS = {("plan_windows", "traces")}


def _job(rule: str) -> str:
    return JOB.get(rule, rule)


def _plan(tmp_path: Path, **sections: Any) -> tuple[Settings, list[Any]]:
    config = write_config(tmp_path / "config.yaml", run=f"test-{tmp_path.name}", **sections)
    settings = build_settings(
        check_config(yaml.safe_load(config.read_text()), REPO / "config" / "schema.yaml")
    )
    jobs, _ = planned_jobs(["--cores", "2", "--configfile", str(config)], "local")
    return settings, jobs


def _expected(settings: Settings, rule: str, param: str) -> dict[str, Any] | None:
    """What the declarations give for a rule's section param, None for a param that is no section."""
    job = _job(rule)
    if param == "generation" and job == "preflight":  # in the order the first runs recorded (payload.py)
        return sampling_params(settings.generation)
    if param == "generation" and job == "serve_check":
        return serve_check_params(settings.generation)
    if param == "validate" and job == "serve_check":
        return None  # per variant: test_the_serve_check_records_its_declared_keys
    if param == "selection":
        return rerun_params(settings.dataset, job) | rerun_params(settings.generation, job)
    if param == "lengths":
        return rerun_params(settings.hidden_states, job)
    if param in SECTIONS:
        return rerun_params(getattr(settings, param), job)
    return None


def _spread(settings: Settings, job: Any) -> dict[str, Any]:
    """A SPREAD rule's section keys among its params."""
    cls = type(getattr(settings, SPREAD[job.rule.name]))
    return {
        key: job.params[key] for key in rerun_keys(cls, _job(job.rule.name)) if key in set(job.params.keys())
    }  # Namedlist: `in` tests values


@pytest.fixture(scope="module", params=["set", "capped"])
def plan(request, tmp_path_factory) -> tuple[Settings, list[Any]]:
    return _plan(tmp_path_factory.mktemp(request.param), **(SET if request.param == "set" else CAPPED))


def test_each_recorded_section_is_what_the_declarations_give(plan):
    settings, jobs = plan
    checked = set()
    for job in jobs:
        for param, value in job.params.items():
            expected = _expected(settings, job.rule.name, param)
            if expected is not None and isinstance(value, dict):
                assert value == expected, (job.rule.name, param)
                assert list(value) == list(expected), (job.rule.name, param)  # the recorded repr's order
                checked.add((job.rule.name, param))
        if job.rule.name in SPREAD:
            section = getattr(settings, SPREAD[job.rule.name])
            assert _spread(settings, job) == rerun_params(section, _job(job.rule.name)), job.rule.name
            checked.add((job.rule.name, SPREAD[job.rule.name]))
    assert {("train_draft", "draft"), ("train_draft", "train"), ("merge_traces", "traces")} <= checked
    assert {("extract_hidden_states", "hidden_states"), ("prepare_prompts", "selection")} <= checked


def test_the_serve_check_records_its_declared_keys(plan):
    """The serve check's own deviation: the baseline's check is not timed and draws no by-k curve; the
    main draft's by_k_max (recorded only while set) comes last, as it was added."""
    settings, jobs = plan
    declared = rerun_params(settings.validate, "serve_check")
    for job in (job for job in jobs if job.rule.name == "serve_check"):
        recorded = job.params.validate
        if job.wildcards.variant.startswith("baseline"):
            assert recorded == {k: v for k, v in declared.items() if k != "by_k_max"} | {"speedup": False}
        else:
            last = {"by_k_max": declared["by_k_max"]} if "by_k_max" in declared else {}
            main = {k: v for k, v in declared.items() if k != "by_k_max"} | last
            assert list(recorded.items()) == list(main.items())
            assert bool(last) == bool(settings.validate.by_k_max)


def test_every_section_a_job_receives_is_whole(plan):
    """A job's section: its recorded param joined with its run-time values (runtime_only), as the scripts
    build it (RuntimeOnly.whole): a key neither holds would be the schema's default, not the user's."""
    settings, jobs = plan
    seen = set()
    for job in jobs:
        runtime = job.params.get("runtime")
        if not isinstance(runtime, RuntimeOnly):
            continue
        for name in SECTIONS & set(runtime.sections):
            if (job.rule.name, name) in NOT_SETTINGS:
                continue
            section = getattr(settings, name)
            recorded = _spread(settings, job) if SPREAD.get(job.rule.name) == name else job.params.get(name)
            assert runtime.whole(type(section), name, recorded) is not None  # raises on a missing key
            if name != "server":  # the server's section travels whole (rules/common/replicas.smk)
                assert runtime.sections[name] == runtime_params(section, _job(job.rule.name)), job.rule.name
            seen.add((job.rule.name, name))
    assert {("serve_check", "validate"), ("preflight_generation", "generation")} <= seen
    assert {("extract_hidden_states", "hidden_states"), ("train_draft", "train")} <= seen


# what the scripts without run-time values build from their params (scripts/*.py)
BUILT = {
    "filter_traces": lambda p: whole(TraceFilters, p.traces),
    "vocab_map": lambda p: whole(Lengths, p.lengths),
    "plan_windows": lambda p: (whole(Batching, p.train), whole(Lengths, p.lengths)),
    "prepare_prompts": lambda p: whole(
        QuestionOrder, {k: v for k, v in p.selection.items() if k != "history"}
    ),
    "build_demo_target": lambda p: whole(DemoSettings, {**dict(p.items()), "enabled": True}),
    "validate_offline_init": lambda p: whole(DraftSettings, p.draft),
    "train_draft": lambda p: whole(DraftSettings, p.draft),
    "train_draft_window": lambda p: whole(DraftSettings, p.draft),
}


def test_the_scripts_sections_build_from_the_planned_params(plan):
    settings, jobs = plan
    built = {job.rule.name for job in jobs if job.rule.name in BUILT and BUILT[job.rule.name](job.params)}
    assert {"filter_traces", "vocab_map", "prepare_prompts", "train_draft"} <= built
    draft = [whole(DraftSettings, job.params.draft) for job in jobs if job.rule.name == "train_draft"]
    assert draft[0] == settings.draft  # the user's values, the later keys too
