"""Rule select_checkpoint: each kept epoch's draft measured offline; the best one's weights for export."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.validate.selection import select_checkpoint

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

select_checkpoint(
    checkpoints=list(snakemake.input.checkpoints),
    epochs=snakemake.params.epochs,
    history_path=snakemake.input.history,
    vocab_map=snakemake.input.vocab_map,
    target_config=snakemake.input.target,
    hidden_states_metadata=snakemake.input.hidden_states_metadata,
    validation_states=list(snakemake.input.states),
    steps=snakemake.params.ttt_steps,
    num_speculative_tokens=snakemake.params.num_speculative_tokens,
    every=snakemake.params.every,
    output_weights=snakemake.output.weights,
    output_selection=snakemake.output.selection,
    cpu_threads=snakemake.threads,
)
