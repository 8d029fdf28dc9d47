"""Rule learning_curve: the points (training tokens, optimizer steps, offline acceptance with its
interval) and the paired gains between them."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.validate.learning_curve import learning_curve

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

files = dict(snakemake.input.items())
metadata = snakemake.input.metadata  # one shard: a path, not a list
learning_curve(
    points=[
        point | {kind: files.get(f"{kind}_{point['shards']}") for kind in ("history", "offline", "selection")}
        for point in snakemake.params.points
    ],
    shards=snakemake.params.shards,
    num_speculative_tokens=snakemake.params.num_speculative_tokens,
    output=snakemake.output[0],
    full_history=snakemake.input.full_history,
    metadata=[metadata] if isinstance(metadata, str) else list(metadata),
    epochs=snakemake.params.epochs,
    entries=snakemake.params.entries,
)
