"""Rule train_draft: the training job, written to a job file under work/, run by `accelerate launch`
with one process per GPU the job sees (eagle3_pipeline.launch; one CPU process without a GPU)."""

from eagle3_pipeline.draft.job import rule_job, write_job
from eagle3_pipeline.hidden_states.engine import wait_gone
from eagle3_pipeline.launch import exec_job, job_gpus
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import DraftSettings, TrainSettings, whole

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

job = rule_job(
    train_states=snakemake.input.train_states,
    validation_states=snakemake.input.validation_states,
    vocab_map=snakemake.input.vocab_map,
    target_config=snakemake.input.target,
    draft=whole(DraftSettings, snakemake.params.draft),
    train=snakemake.params.runtime.whole(TrainSettings, "train", snakemake.params.train),
    work=snakemake.params.work,
    cpu_threads=snakemake.threads,
    weights=snakemake.output.weights,
    history=snakemake.output.history,
    checkpoint_epochs=snakemake.params.get("checkpoint_epochs", []),  # validate.select_every_epochs
    checkpoints=snakemake.output.get("checkpoints", []),
)
job_file = write_job(job, f"{snakemake.params.work}/jobs/train_draft.json")
# Snakemake starts this job once the engine's group is done, not once the engine has exited
wait_gone(snakemake.params.runtime.section("engines").get("roots", []))
exec_job(
    "eagle3_pipeline.draft", job_file, job_gpus(snakemake.resources), snakemake.params.work, snakemake.log[0]
)
