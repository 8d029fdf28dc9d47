"""Rule plan_windows: batches per (epoch, window) under a disk cap, for the learning-rate schedule."""

from eagle3_pipeline.draft.windows import plan_windows, shard_id, write_plan
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

write_plan(
    plan_windows(
        epoch_windows=snakemake.params.windows,
        traces={shard_id(path): path for path in snakemake.input.traces},
        epochs=snakemake.params.train["epochs"],
        max_seq_len=snakemake.params.lengths["max_seq_len"],
        overlong=snakemake.params.lengths["overlong"],
        batch_tokens=snakemake.params.train["batch_tokens"],
        seed=snakemake.params.train["seed"],
    ),
    snakemake.output[0],
)
