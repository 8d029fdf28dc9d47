"""Rule extract_hidden_states: shard k of every split with one load of the target, as a job file under
work/ run by eagle3_pipeline.launch (one process per GPU, one spreading the target over them under
hidden_states.device_map, or the vllm backend's one client of its extraction engine)."""

import os
from dataclasses import fields

from eagle3_pipeline.hidden_states.job import launch_mode, rule_jobs, write_jobs
from eagle3_pipeline.launch import exec_job, job_gpus
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import HiddenStatesSettings

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

params = snakemake.params
# the hidden_states.* keys the rule records, each a param of its own, with its run-time values
names = {f.name for f in fields(HiddenStatesSettings)}
recorded = {key: value for key, value in params.items() if key in names}
hidden_states = params.runtime.whole(HiddenStatesSettings, "hidden_states", recorded)
engine = params.runtime.section("engine")  # the engine's folder and log
jobs = rule_jobs(
    traces=snakemake.input.traces,
    outputs=snakemake.output.states,
    metadata=snakemake.output.metadata,
    shard=int(snakemake.wildcards.shard),
    target_config=snakemake.input.target,
    work=params.work,
    server_json=params.server_json,
    engine_dir=engine["dir"],
    engine_log=engine["log"],
    pack_dir=params.runtime.section("packing").get("dir"),  # its pack slots (packing.pack_slot)
)
job_file = write_jobs(hidden_states, jobs, f"{params.work}/job.json")
if snakemake.threads == 0:  # a vllm client (no core of its own): Snakemake's OMP_NUM_THREADS=0 is
    os.environ["OMP_NUM_THREADS"] = "1"  # refused by libgomp; one thread packs beside the engine
exec_job(
    "eagle3_pipeline.hidden_states",
    job_file,
    job_gpus(snakemake.resources),
    params.work,
    snakemake.log[0],
    mode=launch_mode(hidden_states),
)
