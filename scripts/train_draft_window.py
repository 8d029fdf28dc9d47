"""Rule train_draft_window (under hidden_states.max_disk_gb): one window of one epoch, from the previous
window's state, as a job file run by `accelerate launch` (see scripts/train_draft.py)."""

from eagle3_pipeline.draft.job import WindowJob, rule_job, single_path, write_job
from eagle3_pipeline.hidden_states.engine import wait_gone
from eagle3_pipeline.launch import exec_job, job_gpus
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import DraftSettings, TrainSettings, whole

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

epoch, index = int(snakemake.wildcards.epoch), int(snakemake.wildcards.window)
window = WindowJob(
    epoch=epoch,
    window=index,
    windows=snakemake.params.windows,
    plan=single_path(snakemake.input.plan),
    previous=single_path(snakemake.input.previous),  # none for the very first window
    state=snakemake.output.state,
    shards=snakemake.params.runtime.section("window")["shards"],
)
job = rule_job(
    train_states=snakemake.input.train_states,
    validation_states=snakemake.input.validation_states,
    vocab_map=snakemake.input.vocab_map,
    target_config=snakemake.input.target,
    draft=whole(DraftSettings, snakemake.params.draft),
    train=snakemake.params.runtime.whole(TrainSettings, "train", snakemake.params.train),
    work=snakemake.params.work,
    cpu_threads=snakemake.threads,
    window=window,
    checkpoint_epochs=snakemake.params.get("checkpoint_epochs", []),  # validate.select_every_epochs
)
job_file = write_job(job, f"{snakemake.params.work}/jobs/train_draft_window-{epoch}-{index}.json")
# Snakemake starts this job once the engine's group is done, not once the engine has exited
wait_gone(snakemake.params.runtime.section("engines").get("roots", []))
exec_job(
    "eagle3_pipeline.draft", job_file, job_gpus(snakemake.resources), snakemake.params.work, snakemake.log[0]
)
