"""Generation: every question sent alone to the vLLM server, journaled, written as one shard table.

How many generation requests one server has in flight at most: four caps in four layers.

1. generation.concurrency (C): requests in flight per shard job, its workers and its open connections
   (shard._Workers, http.Http).
2. generation.global_concurrency (G): requests in flight across the shard jobs of one machine sending
   to the same server, as flock'ed slot files (slots.SlotPool; one folder per server:
   work/generations/slots/, work/generations/replica-slots/NAME/). Per node only: jobs on other
   SLURM nodes hold other slots.
3. server.max_shard_jobs (M, each replica its own; null: none): shard jobs against the server at once,
   cluster-wide, as the Snakemake resource vllm_NAME (rules/common/replicas.smk; a `--resources
   vllm_NAME=N` wins).
4. Snakemake's own job limit (S): `--cores N` locally (a shard job takes one core), `--jobs N` under
   a cluster profile.

So a server sees at most min(J * C, nodes * G) requests, J = min(M, S, its shards) shard jobs at once.
None of these is a rerun trigger: they pace the requests, never shape an answer (settings.py).
"""

from typing import Any

__all__ = ["generate_shard", "run_generation"]


def __getattr__(name: str) -> Any:
    """The shard code (aiohttp, polars) loaded on first use: rules/generate.smk imports generate.payload,
    and every parse of the workflow paid for both."""
    if name in __all__:
        from eagle3_pipeline.generate import shard

        return getattr(shard, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
