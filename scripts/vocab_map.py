"""Rule vocab_map: d2t / t2d from the loss-masked token counts of the training hidden states (or, for
windowed training under hidden_states.max_disk_gb, of the training traces: no state exists yet)."""

from eagle3_pipeline.draft.vocab import build_vocab_map, count_trace_tokens
from eagle3_pipeline.draft_config import read_target_config
from eagle3_pipeline.logs import stage
from eagle3_pipeline.settings import Lengths, whole

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

traces = snakemake.input.get("traces")
lengths = whole(Lengths, snakemake.params.lengths)
build_vocab_map(
    metadata_paths=snakemake.input.get("metadata", []),
    target_vocab_size=int(read_target_config(snakemake.input.target)["vocab_size"]),
    draft_vocab_size=snakemake.params.draft_vocab_size,
    output=snakemake.output[0],
    counts=count_trace_tokens(traces, lengths.max_seq_len, lengths.overlong) if traces else None,
)
