"""The extraction job's entry point: one shard of every split it is given, by the configured backend.

Run under `accelerate launch` (`python -m eagle3_pipeline.hidden_states JOB.json`, started by
eagle3_pipeline.launch with the mode that hidden_states.backend and hidden_states.device_map give):

    accelerate launch --cpu --num_processes 1 ...        # CPU: the demo and the tests
    accelerate launch --num_processes 8 --multi_gpu ...  # data parallel: the model fits one GPU;
                                                         # batch b runs on rank b % world_size
    accelerate launch --num_processes 1 ...              # hidden_states.device_map: one process
                                                         # spreads the target over every visible GPU
                                                         # (a 1T MoE)

The vllm backend runs in one plain process (the launcher's client mode): vLLM spreads the target itself.

A job extracts one shard of every split it is given (train and validation), loading the target once
for all of them: for a 1T model the load is most of a job. Every batch's states are saved as a part
under the work folder (parts.py), so a job that dies redoes only the batches it had not saved, and
every split's parts are kept until all of the job's shards are written: Snakemake deletes a failed
job's outputs, so a job that dies in its second split re-packs the first one from its parts, without
the model.
"""

from __future__ import annotations

from typing import Any

from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.settings import HiddenStatesSettings


def extract_shards(
    hidden_states: HiddenStatesSettings, jobs: list[ShardJob], state: Any = None
) -> list[dict[str, Any] | None]:
    """Extract every job's shard with one load of the target; each shard's metadata on the main
    process, else None.

    Args:
        hidden_states: how (backend, layers, dtypes, batch size, ...), for every job alike.
        jobs: what: one per split (job.py).
        state: an `accelerate.PartialState` (made when None).

    Raises:
        sequences.SequenceError: bad trace rows or settings.
        storage.ShardError: a written shard failed validation (kept as `*.invalid`).
        vllm_backend.VllmBackendError, final_norm.FinalNormError: the vllm backend cannot run.
    """
    if hidden_states.backend == "vllm":
        from eagle3_pipeline.hidden_states import vllm_extraction

        return vllm_extraction.extract_shards(hidden_states, jobs, state)
    from eagle3_pipeline.hidden_states import transformers_extraction

    return transformers_extraction.extract_shards(hidden_states, jobs, state)
