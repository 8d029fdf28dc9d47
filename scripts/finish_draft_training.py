"""Rule train_draft under a disk cap: the trained weights and history from the last window's state."""

from eagle3_pipeline.draft.train import TrainJob, finish
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import DraftSettings, TrainSettings, whole

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

job = TrainJob(
    train_shards=[],
    validation_shards=[],
    vocab_map=snakemake.input.vocab_map,
    target=snakemake.params.target,
    draft=whole(DraftSettings, snakemake.params.draft),
    train=snakemake.params.runtime.whole(TrainSettings, "train", snakemake.params.train),
    work=snakemake.params.get("work", ""),  # the windows' kept epochs (validate.select_every_epochs)
    weights=snakemake.output.weights,
    history=snakemake.output.history,
    checkpoint_epochs=snakemake.params.get("checkpoint_epochs", []),
    checkpoints=snakemake.output.get("checkpoints", []),
)
finish(job, snakemake.input.state)
