"""Rule extract_hidden_states: shard k of every split with one load of the target, as a job file under
work/ run by `accelerate launch` (eagle3_pipeline.launch: device_map mode starts one process that
spreads the target over the job's GPUs; the vllm backend starts its own engine from it)."""

from eagle3_pipeline.hidden_states.job import rule_jobs, write_jobs
from eagle3_pipeline.launch import exec_job
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

params = snakemake.params
engine = params.runtime.section("engine")  # the engine's folder and run-time keys (not recorded)
jobs = rule_jobs(
    traces=snakemake.input.traces,
    outputs=snakemake.output.states,
    metadata=snakemake.output.metadata,
    shard=int(snakemake.wildcards.shard),
    target_config=snakemake.input.target,
    work=params.work,
    layers=params.layers,
    max_seq_len=params.max_seq_len,
    overlong=params.overlong,
    dtype=params.dtype,
    compute_dtype=params.compute_dtype,
    batch_tokens=params.batch_tokens,
    trust_remote_code=params.trust_remote_code,
    backend=params.backend,
    vllm={**params.vllm, **{k: v for k, v in engine.items() if k not in ("dir", "log")}},
    server_json=params.server_json,
    device_map=params.launch_mode == "device_map",
    engine_dir=engine["dir"],
    engine_log=engine["log"],
)
job_file = write_jobs(jobs, f"{params.work}/job.json")
exec_job(
    "eagle3_pipeline.hidden_states",
    job_file,
    snakemake.resources.gpu,
    params.work,
    snakemake.log[0],
    mode="client" if params.backend == "vllm" else params.launch_mode,  # vllm: the engine holds the GPUs
)
