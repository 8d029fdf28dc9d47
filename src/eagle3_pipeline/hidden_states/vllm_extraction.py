"""The vllm backend's extraction: every split's missing batches through one vLLM engine, then each
shard packed here.

Only the main process works (vLLM starts its own tensor-parallel workers). Parts and packing are the
transformers backend's (parts.py, packing.py), so resume is shared; the plan fingerprint includes the
backend and the engine settings, so parts of another backend or engine are never mixed in.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from eagle3_pipeline.hidden_states import engine as engine_service
from eagle3_pipeline.hidden_states import engine_watch, final_norm, kept, sequences, vllm_backend
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.hidden_states.packing import commit_shard, finish_shard
from eagle3_pipeline.hidden_states.parts import fingerprint, missing_batches, part_path, prepare_work
from eagle3_pipeline.hidden_states.plan import ShardPlan, plan_shard, target_info
from eagle3_pipeline.planning.engines import SERVICE
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import HiddenStatesSettings
from eagle3_pipeline.target_shape import engine_layer_ids

log = logging.getLogger(__name__)


def extract_shards(
    hidden_states: HiddenStatesSettings, jobs: list[ShardJob], state: Any = None, keep_work: bool = False
) -> list[dict[str, Any] | None]:
    """Every job's missing batches through the extraction engine, then each shard packed; the work
    folders go once all are written (`keep_work`: they stay, for a test that packs them again).

    A client of an engine job (Snakemake starts all of them with the engine, one group) plans its
    shards at once, while the engine starts and the other clients' batches run; it takes one of the
    engine's `max_clients` slots only to queue its batches and wait for them (run_on_engine), and
    packs after it left the slot: the next client's request is in the queue before this one's last
    batch is done, so the engine never waits for a client to plan or pack.

    Raises:
        vllm_backend.VllmBackendError: no interpreter with vLLM, a bad setting, or the engine failed.
        final_norm.FinalNormError: the target's final norm cannot be rebuilt (use transformers).
    """
    if state is not None and not state.is_main_process:
        log.info("vllm backend: rank %d has nothing to do", state.process_index)
        return [None] * len(jobs)
    first = jobs[0]
    engine_dir = Path(first.engine_dir) if first.engine_dir is not None else None
    if engine_dir is not None:  # a client of an engine job: it ends with it (a failed group)
        engine_watch.watch(engine_dir / SERVICE)
    snapshot = vllm_backend.read_snapshot(first.server_json)
    engine = vllm_backend.engine_settings(
        hidden_states.vllm, snapshot, hidden_states.max_seq_len, hidden_states.batch_tokens
    )
    log.info(
        "vLLM engine settings: %s (from %s)",
        {k: v for k, v in engine.items() if k != "sources"},
        engine["sources"],
    )
    plans = [plan_shard(hidden_states, job) for job in jobs]
    keys = [fingerprint(hidden_states, plan, engine) for plan in plans]
    # shards this job finished before its group failed (Snakemake removed them): taken back, not redone
    restored = [
        kept.restore(engine_dir, plan.job, key) if engine_dir else None
        for plan, key in zip(plans, keys, strict=True)
    ]
    todo_plans = [(plan, key) for plan, key, meta in zip(plans, keys, restored, strict=True) if meta is None]
    batches: list[dict[str, Any]] = []
    for plan, key in todo_plans:
        parts = prepare_work(plan.job.work, key)
        todo = missing_batches(parts, plan)
        log.info(
            "%s: %d batches to run, %d already saved",
            plan.job.output,
            len(todo),
            len(plan.batches) - len(todo),
        )
        batches += [
            {
                "part": str(part_path(parts, b)),
                "index": plan.batches[b],
                "input_ids": [plan.seqs[i].input_ids for i in plan.batches[b]],
            }
            for b in todo
        ]
    if batches:
        records = [str(plan.job.work / "engine.json") for plan, _ in todo_plans]
        run_on_engine(hidden_states, first, snapshot, {"batches": batches, "records": records})
    metas = [_pack(hidden_states, plan, engine) for plan, _ in todo_plans]
    for (plan, key), meta in zip(todo_plans, metas, strict=True):  # every split packed: all committed at once
        commit_shard(plan.job, meta, keep_work)
        if engine_dir is not None:
            kept.keep(engine_dir, plan.job, key)
    if engine_dir is not None:
        kept.finished(engine_dir)
    if not keep_work:
        for job in jobs:
            shutil.rmtree(job.work, ignore_errors=True)
    packed = iter(metas)
    return [meta if meta is not None else next(packed) for meta in restored]


def _pack(hidden_states: HiddenStatesSettings, plan: ShardPlan, engine: dict[str, Any]) -> dict[str, Any]:
    """Pack one split's saved parts (packing.finish_shard) with the vllm backend's metadata: the engine
    that ran (its record), or the settings requested when every batch was saved before."""
    layer_ids = engine_layer_ids(plan.layers, plan.info.num_layers)
    norm = final_norm.find_final_norm(plan.job.target)
    record_path = plan.job.work / "engine.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    requested = {k: v for k, v in engine.items() if k != "sources"}
    backend = {
        "compute_dtype": (record or requested)["dtype"],
        "engine": record or {**requested, "layer_ids": layer_ids, "ran": False},
        "final_state_source": f"vLLM id {plan.info.num_layers} (before the final norm), then the "
        f"target's final RMSNorm ({norm.key}, eps {norm.eps}) applied in float32",
    }
    return finish_shard(hidden_states, plan, backend)


def engine_spec_for(
    hidden_states: HiddenStatesSettings, target: Path, snapshot: ServerSnapshot | None, directory: Path
) -> dict[str, Any]:
    """What the engine of `directory` runs for these settings and this target (its spec.json): the engine
    job and each of its clients build it alike, so a client checks that it joins the right engine."""
    options = hidden_states.vllm
    engine = vllm_backend.engine_settings(
        options, snapshot, hidden_states.max_seq_len, hidden_states.batch_tokens
    )
    info = target_info(Path(target), hidden_states.trust_remote_code)
    layers = sequences.resolve_layers(hidden_states.layers, info.num_layers)
    in_flight = vllm_backend.in_flight_tokens(options, engine)
    return vllm_backend.engine_spec(
        target,
        engine,
        engine_layer_ids(layers, info.num_layers),
        hidden_states.dtype,
        final_norm.find_final_norm(Path(target)).as_dict(),
        vllm_backend.staging_dir(options, Path(directory), in_flight, info.hidden_size),
        in_flight,
        options.idle_timeout_s,
    )


def serve_engine(
    hidden_states: HiddenStatesSettings,
    target: Path,
    server_json: Path | None,
    directory: Path,
    engine_log: Path | None = None,
    marker: Path | None = None,
    handle_signals: bool = True,
    record_dir: Path | None = None,
) -> dict[str, Any]:
    """Rule serve_extraction_engine: the engine of `directory` for its clients, until Snakemake ends the
    job (engine.serve); returns its report (how it stopped, busy fraction, tokens), also written to
    `record_dir`/START_ID.json (the run's engine stats, engine.write_record).

    Raises:
        vllm_backend.VllmBackendError: no interpreter with vLLM, or a bad setting.
        final_norm.FinalNormError: the target's final norm cannot be rebuilt (use transformers).
    """
    snapshot = vllm_backend.read_snapshot(Path(server_json) if server_json else None)
    python = vllm_backend.resolve_python(hidden_states.vllm, snapshot)
    spec = engine_spec_for(hidden_states, target, snapshot, directory)
    if engine_log:
        spec["log"] = str(engine_log)
    env = vllm_backend.worker_env(vllm_backend.package_path(Path(directory)), snapshot)
    return engine_service.serve(Path(directory), python, spec, env, marker, handle_signals, record_dir)


def run_on_engine(
    hidden_states: HiddenStatesSettings,
    job: ShardJob,
    snapshot: ServerSnapshot | None,
    request: dict[str, Any],
) -> dict[str, Any]:
    """Run a job's batches on its extraction engine, waiting for every part.

    The engine is the one its Snakemake job runs in `job.engine_dir` (rule serve_extraction_engine,
    shared with the other jobs of its scope), the request queued and waited for in one of its client
    slots (engine.client_slot); with no engine_dir (a rerun Snakemake planned without an
    engine job: the outputs were there; tests, benchmarks) a private one, stopped when this returns.

    Raises:
        engine.EngineError: the engine failed to start, or died (the parts saved are kept).
    """
    if job.engine_dir is not None:
        directory = Path(job.engine_dir)
        spec = engine_spec_for(hidden_states, job.target, snapshot, directory)
        if job.engine_log:
            spec["log"] = str(job.engine_log)
        info = engine_service.join(directory, spec)
        kept.joined(directory, info["start_id"])  # until its shards are committed (kept.release)
        # a slot while this request is queued or runs: at most max_clients requests in the engine's
        # queue, the next one queued as soon as one is done
        with engine_service.client_slot(directory, hidden_states.vllm.max_clients):
            return _submit(directory, info, request)
    with tempfile.TemporaryDirectory(prefix="eagle3-engine-") as scratch:
        directory = Path(scratch)
        spec = engine_spec_for(hidden_states, job.target, snapshot, directory)
        python = vllm_backend.resolve_python(hidden_states.vllm, snapshot)
        env = vllm_backend.worker_env(vllm_backend.package_path(directory), snapshot)
        try:
            info = engine_service.start_or_join(directory, python, spec, env)
            return _submit(directory, info, request)
        finally:
            log.info("private engine: %s", engine_service.stop_engine(directory))


def _submit(directory: Path, info: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    # queued before the engine is ready: it takes the batches as soon as it is, with no wait
    name = engine_service.enqueue(directory, request)
    log.info("extraction engine %s: %d batches queued", info["start_id"], len(request["batches"]))
    done = engine_service.wait_or_cancel(directory, info, name)
    log.info("extraction engine %s: %d tokens in %.1f s", info["start_id"], done["tokens"], done["s"])
    return done
