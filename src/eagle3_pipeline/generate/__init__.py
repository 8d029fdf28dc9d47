"""Generation: every question sent alone to the vLLM server, journaled, written as one shard table."""

from eagle3_pipeline.generate.shard import generate_shard, run_generation

__all__ = ["generate_shard", "run_generation"]
