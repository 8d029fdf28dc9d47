# Config validation into SETTINGS, the run's folders and shard list, wildcard constraints, rule all's
# targets; the helpers the stages share are in common/ (windows, variants, engine, inputs, replicas,
# serve_check).
# Nothing here touches the network, a server, a GPU or a dataset: a dry run of 10,000 shards must plan
# in seconds.
# The conda environment of every step is ../envs/pipeline.yaml (generated from envs/*.txt by
# envs/conda_envs.py); Snakemake builds and uses it only under --use-conda (a cluster without the
# project's virtualenvs), and ignores it otherwise.
from eagle3_pipeline.config import check_config, shard_ids
from eagle3_pipeline.hidden_states.allocation import gpu_form, plain_resources
from eagle3_pipeline.hidden_states.allocation import (
    gpu_request as allocation_gpu_request,
)
from eagle3_pipeline.settings import build_settings

check_config(config, workflow.source_path("../config/schema.yaml"))
# The config as typed, frozen sections. Params are rerun triggers (rerun-triggers in profiles/): a
# rule passes as params only what its output depends on (rerun_params, from the jobs each field of
# settings.py declares it reruns), and what a job needs only while it runs (timeouts, pacing, how to
# reach a server whose identity is an input) as runtime_only(...), an object Snakemake does not record
# (eagle3_pipeline.settings.RuntimeOnly): changing it reruns nothing.
SETTINGS = build_settings(config)

RESULTS = f"results/{SETTINGS.run}"
LOGS = f"{RESULTS}/logs"
WORK = f"{RESULTS}/work"
SHARDS = shard_ids(SETTINGS.dataset.num_samples, SETTINGS.dataset.shard_size)


def shard_files(*patterns):
    """An input function giving each pattern's file for every shard.

    A function rather than a list: Snakemake hashes a list input once per file in it when the rule
    also names another rule's output, which is quadratic in the shard count.
    """
    files = [path for pattern in patterns for path in expand(pattern, shard=SHARDS)]

    def get_shard_files(wildcards):
        return files

    return get_shard_files


def resource_limit(name):
    """The run's limit on resource `name` (the command line's or the profile's, a Resource there, or
    one set by these rules); None when unlimited."""
    limit = workflow.global_resources.get(name)
    return getattr(limit, "value", limit)


def profile_resources(name=None):
    """The workflow profile's (or the command line's) resources as plain values: set-resources of the
    rule named `name`, or with None default-resources. Every job's own process gets the same.
    """
    resources = workflow.resource_settings
    if name is None:
        return plain_resources(resources.default_resources)
    return plain_resources(resources.overwrite_resources.get(name))


# How the profile names GPUs (its default-resources' gpus_as: gpus -> --gpus=N, gres -> --gres=gpu:N):
# each GPU rule's own request is in that form (gpu_request), so that a rule the profile sizes in that
# form carries nothing else (SLURM refuses --gres=gpu:8 beside a default's --gpus=1)
GPU_FORM = gpu_form(profile_resources())


def gpu_request(count):
    """A GPU rule's own resources for `count` GPUs, in the profile's form (`resources: **gpu_request(1)`)."""
    return allocation_gpu_request(GPU_FORM, count)


# The shared helpers, one idea per file (each needs the names above; windows needs the variants'):
include: "common/variants.smk"
include: "common/windows.smk"
include: "common/engine.smk"
include: "common/inputs.smk"
include: "common/replicas.smk"
include: "common/serve_check.smk"


wildcard_constraints:
    shard=r"\d{5}",
    block=r"\d{5}",
    split="train|validation",
    epoch=r"\d+",
    window=r"\d+",
    # "(?:)" for the main draft alone: an empty constraint would mean none (any non-empty name)
    variant="|".join(f"(?:{variant})" for variant in VARIANTS),


# outputs of rule all beside the stages' (the Kimi demo's head-to-head, rules/demo_head_to_head.smk)
EXTRA_FINAL_OUTPUTS = []


def get_final_outputs():
    outputs = [
        f"{RESULTS}/traces/stats.json",
        f"{RESULTS}/draft/checkpoint/config.json",
        f"{RESULTS}/validation/offline.json",
        f"{RESULTS}/report/acceptance.png",  # asks for every picture of the report (plot_validation)
    ]
    if SETTINGS.validate.serve_check:
        outputs.append(f"{RESULTS}/validation/serve_check.json")
    return outputs + EXTRA_FINAL_OUTPUTS
