"""The workflow profiles, checked through Snakemake and the SLURM plugin's own code.

The sbatch lines are rendered by snakemake-executor-plugin-slurm itself (get_submit_command,
set_gres_string, validate_slurm_extra, Executor.get_partition_arg) for jobs of a real dry-run DAG of
the Kimi example planned with profiles/slurm: the same calls Executor.run_job makes before `sbatch`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from snakemake_executor_plugin_slurm import Executor
from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string
from snakemake_executor_plugin_slurm.validation import validate_slurm_extra
from support.workflow import KIMI_CONFIG, KIMI_TARGET_CONFIG, REPO, planned_jobs, write_config

from eagle3_pipeline.config import check_config
from eagle3_pipeline.hidden_states import cost
from eagle3_pipeline.settings import build_settings

# The Kimi example caps the states on disk (hidden_states.max_disk_gb): training runs window by window;
# its extraction engine (vllm backend) is a job of its own, grouped with its extraction jobs
GPU_RULES = ("serve_extraction_engine", "train_draft_window")
KIMI_CONFIG_TARGET = yaml.safe_load(KIMI_CONFIG.read_text())["target"]["model"]  # /models/Kimi-K2.5


def render_sbatch(job, settings) -> str:
    """The sbatch call the plugin would submit for `job` (without --wrap, the command it runs)."""
    validate_slurm_extra(job)  # raises WorkflowError on --gpus/--gres/... in slurm_extra
    plugin = SimpleNamespace(_partitions=None, _fallback_partition=None, logger=logging.getLogger("slurm"))
    params = {
        "run_uuid": "RUN",
        "slurm_logfile": f".snakemake/slurm_logs/rule_{job.name}/%j.log",
        "comment_str": f"rule_{job.name}",
        # The plugin checks a given slurm_account with sacctmgr (no SLURM here) and else guesses one;
        # when it cannot, it submits without -A, as rendered here.
        "account": "",
        "partition": Executor.get_partition_arg(plugin, job),
        "workdir": str(REPO),
    }
    return get_submit_command(job, params, settings=settings) + set_gres_string(job)


# The Kimi example on 4 shards under a cap of 2 shards' bound (117 GB each, the training state files
# beside them): the same rules, resources and windows as the whole example, a DAG 25 times smaller
# (the whole example's dry run costs about 25 CPU seconds, most of it Snakemake's group checks)
SMALL = {"dataset": {"num_samples": 800}, "hidden_states": {"max_disk_gb": 300}}


def _plan(tmp_path: Path, profile: Path, weights: bool = True, **overrides) -> dict[str, list]:
    """The plan on `profile`: with a stand-in of the weights' config.json, or (weights False) as a login
    node without them plans it, the example's target.model absent (rule require_target_weights)."""
    if weights:
        target = tmp_path / "Kimi-K2.5"
        target.mkdir(exist_ok=True)
        (target / "config.json").write_text(json.dumps(KIMI_TARGET_CONFIG))
        overrides["target"] = {"model": str(target)}
    config = write_config(tmp_path / "kimi.yaml", KIMI_CONFIG, run=f"test-{tmp_path.name}", **overrides)
    jobs, settings = planned_jobs(["--workflow-profile", str(profile), "--configfile", str(config)], "slurm")
    by_rule: dict[str, list] = {}
    for job in jobs:
        by_rule.setdefault(job.rule.name, []).append(job)
    return {"jobs": by_rule, "settings": settings}


@pytest.fixture(scope="module")
def slurm_plan(tmp_path_factory):
    """The whole example on profiles/slurm, planned where its weights are not (a login node): the
    documented `snakemake -n --workflow-profile profiles/slurm` (test_planning_without_weights.py runs
    it without the profile)."""
    if Path(KIMI_CONFIG_TARGET).exists():
        pytest.skip(f"{KIMI_CONFIG_TARGET} exists here: this plan is the one made without the weights")
    return _plan(tmp_path_factory.mktemp("slurm"), REPO / "profiles" / "slurm", weights=False)


def test_without_the_weights_one_job_stands_in_for_them(slurm_plan):
    assert len(slurm_plan["jobs"]["require_target_weights"]) == 1
    assert "build_demo_target" not in slurm_plan["jobs"]
    # the jobs that read the target's config.json wait on that job, none on the absent file
    engine = slurm_plan["jobs"]["serve_extraction_engine"][0]
    assert any(str(f).endswith("work/target/config.json.absent") for f in engine.input)


# the engine's CPUs: its own 64 and one for each of the 4 clients that may pack at once, as
# --cpus-per-task (right beside --gres too); training's 8 per GPU
GPU_RULE_CPUS = {"serve_extraction_engine": "--cpus-per-task=68", "train_draft_window": "--cpus-per-gpu=8"}


@pytest.mark.parametrize("rule", GPU_RULES)
def test_gpu_rules_ask_slurm_for_8_gpus_by_the_gpu_resource(slurm_plan, rule):
    for job in slurm_plan["jobs"][rule][:3]:
        line = render_sbatch(job, slurm_plan["settings"])
        assert re.findall(r"--gpus=\S+", line) == ["--gpus=8"], line
        assert "--gres" not in line
        assert " -p gpu " in line and f" {GPU_RULE_CPUS[rule]} " in line
        assert re.search(r" -t \d+ ", line) and re.search(r" --mem \d+ ", line)


def test_extraction_and_training_sizes_come_from_the_profile(slurm_plan):
    settings = slurm_plan["settings"]
    first = slurm_plan["jobs"]["serve_extraction_engine"][0]
    engine = render_sbatch(first, settings)
    train = render_sbatch(slurm_plan["jobs"]["train_draft_window"][0], settings)
    # the engine's own 1,000,000 MiB and 4 packing clients' 2,213 MiB (allocation.py); the time limit of
    # a window of 34 shards at the bound: (600 s + 69.6 M tokens / 10,000 tokens/s) x 1.5 = 190 min
    assert " -t 190 " in engine and " --mem 1008852 " in engine
    # an extraction job (a client of the engine): no GPU, its floor, its engine's time and partition
    client = next(job for job in first.dag._group[first] if job.rule.name == "extract_hidden_states")
    extract = render_sbatch(client, settings)
    assert "--gpus" not in extract and " --mem 512 " in extract and " -p gpu " in extract
    assert " -t 190 " in extract
    assert " -t 240 " in train and " --mem 256000 " in train  # one window of one epoch


def test_cpu_rules_get_no_gpu_and_the_default_partition(slurm_plan):
    settings = slurm_plan["settings"]
    for rule in ("generate_shard", "merge_traces", "prepare_prompts"):
        line = render_sbatch(slurm_plan["jobs"][rule][0], settings)
        assert "--gpus" not in line and "--gres" not in line
        assert " -p cpu " in line and "--ntasks=1" in line
    assert "--cpus-per-task=8" in render_sbatch(slurm_plan["jobs"]["merge_traces"][0], settings)
    assert " -t 720 " in render_sbatch(slurm_plan["jobs"]["generate_shard"][0], settings)


def test_small_bookkeeping_jobs_run_on_the_submit_host(slurm_plan):
    """One sbatch per prompt shard would cost more than the slice it writes."""
    # job.is_local is always true in a dry run (local execution): read the workflow's localrules
    localrules = slurm_plan["jobs"]["write_prompt_shard"][0].dag.workflow._localrules
    assert {"write_prompt_shard", "check_disk_budget", "train_draft"} <= localrules  # train_draft: the
    # last window's state written out
    assert not localrules & {"prepare_prompts", "generate_shard", "split_traces", *GPU_RULES}


def test_no_job_carries_forbidden_flags_in_slurm_extra(slurm_plan):
    for jobs in slurm_plan["jobs"].values():
        for job in jobs:
            validate_slurm_extra(job)
            extra = job.resources.get("slurm_extra", "") or ""
            assert "--gpus" not in extra and "--gres" not in extra


def test_each_engine_job_is_one_group_with_its_window_s_extraction_jobs(slurm_plan):
    # issue 37: Snakemake groups a service job with its consumers (one submission on one node): one
    # group per epoch and window, holding the engine and the window's 34 (or 32) extraction jobs
    groups: dict = {}
    for rule in ("serve_extraction_engine", "extract_hidden_states"):
        for job in slurm_plan["jobs"][rule]:
            assert job.group is not None, job
            groups.setdefault(job.group, []).append(job.rule.name)
    assert len(groups) == 10 * 3
    for names in groups.values():
        assert names.count("serve_extraction_engine") == 1 and names.count("extract_hidden_states") in (
            32,
            34,
        )


def test_an_engine_group_is_one_sbatch_on_one_node_with_its_clients_memory_added(slurm_plan, tmp_path):
    # the submission Snakemake makes for an engine's group (the GroupJob of the plan), rendered by the
    # plugin: docs/cluster.md quotes this line for the example's first window (34 extraction jobs)
    engine = slurm_plan["jobs"]["serve_extraction_engine"][0]
    group = engine.dag._group[engine]
    clients = [job for job in group if job.rule.name == "extract_hidden_states"]
    line = render_sbatch(group, slurm_plan["settings"])
    assert len(clients) == 34 and len(group) == 35
    assert re.findall(r"--gpus=\S+", line) == ["--gpus=8"] and " --nodes=1 " in line  # the engine's
    # summed by Snakemake: the engine's 1,008,852 MiB (its own and 4 packing clients') and each client's
    # 512, not 4,000 per client (1,136,000 before); 64 + 4 CPUs; its scope's time limit
    assert f" --mem {1_008_852 + 34 * 512} " in line
    assert " -t 190 " in line and " -p gpu " in line and " --cpus-per-task=68 " in line
    assert "--cpus-per-gpu" not in line
    assert "_extract_hidden_states_serve_extraction_engine/%j.log" in line
    # make cost prints the same flags for each of the DAG's 30 engine groups (20 of this size)
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    settings = build_settings(
        check_config(yaml.safe_load(KIMI_CONFIG.read_text()), REPO / "config" / "schema.yaml")
    )
    out = cost.estimate(settings, 7168, results=tmp_path, profile=profile)
    groups = {job.group for job in slurm_plan["jobs"]["serve_extraction_engine"]}
    assert out["engine_starts_now"] == len(groups) == 30
    first = out["allocations_now"]["per_allocation"][0]
    assert first["shards"] == 34 and " ".join(line.replace(f" -D {REPO}", "").split()).endswith(
        first["sbatch"]
    )


def _gres_profile(tmp_path: Path, **engine: object) -> Path:
    """profiles/slurm for a site that names GPUs as gres: gpus_as: gres, each `gpu: N` as `gres: gpu:N`."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["default-resources"]["gpus_as"] = "gres"
    for resources in profile["set-resources"].values():
        if "gpu" in resources:
            resources["gres"] = f"gpu:{resources.pop('gpu')}"
    profile["set-resources"]["serve_extraction_engine"].update(engine)
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    return tmp_path / "profile"


def test_a_gres_site_gets_gres_and_the_engine_s_cpus(tmp_path):
    # gpus_as: gres: every GPU rule asks --gres=gpu:N and none --gpus (SLURM refuses --gres=gpu:8 beside
    # --gpus=1, and gives --gres=gpu:8 alone one CPU): the engine's CPUs as --cpus-per-task
    plan = _plan(tmp_path, _gres_profile(tmp_path), **SMALL)
    engine = plan["jobs"]["serve_extraction_engine"][0]
    line = render_sbatch(engine.dag._group[engine], plan["settings"])
    assert " --gres=gpu:8" in line and "--gpus" not in line and " --cpus-per-task=68 " in line
    # 2 shards a window: 1,008,852 + 2 x 512 MiB; (600 s + 4.1 M tokens / 10,000 tokens/s) x 1.5
    assert " --mem 1009876 " in line and " -t 26 " in line
    train = render_sbatch(plan["jobs"]["train_draft_window"][0], plan["settings"])
    assert train.endswith(" --gres=gpu:8") and "--gpus" not in train and " --cpus-per-gpu=8 " in train
    validate = render_sbatch(plan["jobs"]["validate_offline"][0], plan["settings"])
    assert validate.endswith(" --gres=gpu:1") and "--gpus" not in validate  # its own request, in that form


def test_the_profile_s_runtime_for_the_engine_is_the_group_s(tmp_path):
    plan = _plan(tmp_path, _gres_profile(tmp_path, runtime=720, mem_mb=900000), **SMALL)
    engine = plan["jobs"]["serve_extraction_engine"][0]
    line = render_sbatch(engine.dag._group[engine], plan["settings"])
    # its clients ask for their engine's time, not the plan's; its memory replaces its own sum
    assert " -t 720 " in line and " --mem 901024 " in line


def test_the_gpu_rules_plan_every_shard(slurm_plan):
    config = yaml.safe_load(KIMI_CONFIG.read_text())
    shards = -(-config["dataset"]["num_samples"] // config["dataset"]["shard_size"])
    epochs, windows = config["train"]["epochs"], -(-shards // 34)  # windows of 34 shards under the cap
    # both splits of a shard per job, once per epoch (the states are deleted once trained on)
    assert len(slurm_plan["jobs"]["extract_hidden_states"]) == shards * epochs
    assert len(slurm_plan["jobs"]["train_draft_window"]) == epochs * windows
    assert len(slurm_plan["jobs"]["train_draft"]) == 1


def test_gpu_model_becomes_a_typed_gpus_request(tmp_path):
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["set-resources"]["serve_extraction_engine"]["gpu_model"] = "b200"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    plan = _plan(tmp_path, tmp_path / "profile", **SMALL)
    line = render_sbatch(plan["jobs"]["serve_extraction_engine"][0], plan["settings"])
    assert re.findall(r"--gpus=\S+", line) == ["--gpus=b200:8"]


def test_forbidden_slurm_extra_is_refused_by_the_plugin(tmp_path):
    from snakemake_interface_common.exceptions import WorkflowError

    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile["set-resources"]["train_draft_window"]["slurm_extra"] = "'--gres=gpu:8'"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    plan = _plan(tmp_path, tmp_path / "profile", **SMALL)
    assert len(plan["jobs"]["train_draft_window"]) == 2 * 10  # windowed as the example: 2 per epoch
    with pytest.raises(WorkflowError, match="generic resources"):
        render_sbatch(plan["jobs"]["train_draft_window"][0], plan["settings"])


def test_default_profile_caps_gpu_requests_to_what_the_machine_has(tmp_path):
    """Locally a rule asking for 8 GPUs on a 1-GPU profile is given 1, and launched with 1 process.
    Extraction on the transformers backend, where its jobs hold the GPUs (under vllm they are the
    clients of an engine job, grouped with it: a group's GPUs are summed)."""
    config = write_config(
        tmp_path / "demo.yaml", run=f"test-{tmp_path.name}", hidden_states={"backend": "transformers"}
    )
    jobs, _ = planned_jobs(
        ["--configfile", str(config), "--set-resources", "extract_hidden_states:gpu=8", "train_draft:gpu=8"],
        "local",
    )
    gpu_jobs = [job for job in jobs if job.rule.name in ("extract_hidden_states", "train_draft")]
    assert gpu_jobs and all(job.resources.gpu == 1 for job in gpu_jobs)
    extract = next(job for job in gpu_jobs if job.rule.name == "extract_hidden_states")
    # its script hands resources.gpu to eagle3_pipeline.launch, which clamps it to what is visible
    assert extract.rule.script.endswith("scripts/extract_hidden_states.py") and extract.shellcmd is None
    machine = (sys.executable, str(REPO))  # nothing machine-specific in params (they are rerun triggers)
    assert not [value for value in extract.params for path in machine if path in str(value)]


def test_default_profile_settings():
    profile = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert profile["resources"] == ["gpu=1"]
    assert set(profile["rerun-triggers"]) == {"mtime", "params", "input", "software-env", "code"}
    assert profile["keep-going"] is False and profile["printshellcmds"] is True
