"""A KV connector that writes vLLM's extracted hidden states synchronously, on any device.

Imported by vLLM's worker processes (`kv_connector_module_path`), in the interpreter that has vLLM
installed; it imports vLLM and torch only. vLLM's `ExampleHiddenStatesConnector` copies the states out
of its hidden-state "KV cache" on a CUDA stream into pinned host memory and writes them from a thread
pool; on the CPU build the pinned allocation fails ("pin_memory=True requires a CUDA or other
accelerator backend"). This subclass copies the slots to CPU and writes the file before returning, then
releases the per-file lock the reader waits on (the lock and the file names are the parent's). The
write is on the engine's step, which costs little next to a CPU forward over the same tokens. On CUDA
the worker uses vLLM's own asynchronous connector instead (hidden_states.vllm.connector: auto); this
one runs there only when asked for (`sync`, the GPU check's comparison). It overrides private members
of the parent (`_submit_async_write`, `_lock_fds`, `_req_copy_events`): the backend refuses a vLLM
outside extraction's supported range (vllm_releases.py), and `make vllm-compat` checks every name used
here in each supported release's wheel (VLLM_NAMES below).
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

# what this subclass relies on of its parent (vllm_compat.py reads this literal without importing the
# module, which imports vLLM)
VLLM_NAMES = (
    (
        "name",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "ExampleHiddenStatesConnector",
    ),
    ("name", "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector", "PendingSave"),
    (
        "name",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "extract_from_kv_cache",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "ExampleHiddenStatesConnector._submit_async_write",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "ExampleHiddenStatesConnector._is_tp_rank_zero",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "ExampleHiddenStatesConnector._kv_cache",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "ExampleHiddenStatesConnector._block_size",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "ExampleHiddenStatesConnector._lock_fds",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "ExampleHiddenStatesConnector._req_copy_events",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "PendingSave.block_ids",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "PendingSave.token_ids",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "PendingSave.filename",
    ),
    (
        "member",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",
        "PendingSave.req_id",
    ),
)


class _Done:
    """Stands in for the parent's CUDA copy event: the write already happened."""

    @staticmethod
    def query() -> bool:
        return True


class SyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector whose save is a synchronous CPU copy plus `save_file`."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None, "register_kv_caches was not called"
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]
        states = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), num_tokens)
        tensors = {"hidden_states": states.to("cpu").contiguous(), "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file(tensors, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: the reader blocked on LOCK_SH proceeds
        self._req_copy_events[pending.req_id] = _Done()  # reported as finished sending by get_finished
