"""Rule export_draft: the trained draft as an EAGLE-3 checkpoint that vLLM and SGLang load, and in
speculators' format beside it."""

from pathlib import Path

from eagle3_pipeline.draft.export import export_checkpoint
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

export_checkpoint(
    weights=snakemake.input.weights,
    vocab_map=snakemake.input.vocab_map,
    target_config=snakemake.input.target,
    hidden_states_metadata=snakemake.input.hidden_states_metadata,
    output_config=snakemake.output.config,
    output_weights=snakemake.output.weights,
    speculators_dir=Path(snakemake.output.speculators_config).parent,
    verifier=snakemake.params.get("hub_id"),  # target.hub_id, when set
    speculative_tokens=snakemake.params.speculative_tokens,
)
