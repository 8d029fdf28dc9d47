"""The per-shard extraction job: sequences -> batches -> parts under work/ -> one packed shard.

Launch modes (`python -m eagle3_pipeline.hidden_states JOB.json` under `accelerate launch`):

    accelerate launch --cpu --num_processes 1 ...        # CPU: the demo and the tests
    accelerate launch --num_processes 8 --multi_gpu ...  # data parallel: the model fits one GPU;
                                                         # batch b runs on rank b % world_size
    accelerate launch --num_processes 1 ... --device-map # the model is spread over every visible GPU
                                                         # (a 1T MoE); extra ranks exit at once

Every batch's states are saved under the work folder as `parts/batch-{b:05d}.safetensors` (atomically),
so a job that dies redoes only the batches it had not saved. The work folder carries a fingerprint of
the plan (ids, token ids, layers, target, dtypes, batch size); a different plan starts afresh. Rank 0
waits for every rank, streams the parts into the packed shard in trace-row order (tmp + rename),
validates it, writes the JSON sibling and removes the work folder.

A rule job extracts one shard of every split it is given (`extract_shards`: train and validation),
loading the target once for all of them: for a 1T model the load is most of a job. Every split's
parts are kept until all of the job's shards are written: Snakemake deletes a failed job's outputs,
so a job that dies in its second split re-packs the first one from its parts, without the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states import capture, sequences, storage
from eagle3_pipeline.hidden_states.sequences import TrainingSequence
from eagle3_pipeline.settings import HIDDEN_STATES_DEFAULTS

log = logging.getLogger(__name__)


@dataclass
class ExtractSettings:
    """One job: which shard of which traces, through which target, into which files."""

    traces: Path
    shard: int
    target: Path
    output: Path
    metadata: Path
    work: Path
    layers: list[Any] = field(default_factory=lambda: ["auto"])
    # the schema's defaults (settings.py), for a job built in code without them (tests)
    max_seq_len: int = HIDDEN_STATES_DEFAULTS.max_seq_len
    overlong: str = HIDDEN_STATES_DEFAULTS.overlong
    dtype: str = HIDDEN_STATES_DEFAULTS.dtype
    batch_tokens: int = HIDDEN_STATES_DEFAULTS.batch_tokens
    compute_dtype: str = HIDDEN_STATES_DEFAULTS.compute_dtype
    device_map: bool = HIDDEN_STATES_DEFAULTS.device_map
    trust_remote_code: bool = HIDDEN_STATES_DEFAULTS.trust_remote_code
    # "transformers" (in this process) or "vllm" (vllm_backend.py: the serving engine's own states); a
    # rule's job file always names it (the schema's default is vllm), a job built in code runs here
    backend: str = "transformers"
    vllm: dict[str, Any] = field(default_factory=dict)  # hidden_states.vllm (None values: snapshot)
    server_json: Path | None = None  # the served unit's snapshot: the vllm backend's engine settings
    # the vllm backend's engine folder, shared by the jobs of one engine (engine.py); None: a private
    # engine for this call, stopped when it returns (tests, benchmarks)
    engine_dir: Path | None = None
    engine_log: Path | None = None  # the engine's own log (None: engine_dir/engine.log)


@dataclass
class TargetInfo:
    num_layers: int
    hidden_size: int
    vocab_size: int
    config_sha: str


def target_info(target: Path, trust_remote_code: bool = False) -> TargetInfo:
    """Layer count, hidden size and vocab of the target's language model, from its config.json."""
    from transformers import AutoConfig

    config = capture.text_config(AutoConfig.from_pretrained(str(target), trust_remote_code=trust_remote_code))
    sha = hashlib.sha256((Path(target) / "config.json").read_bytes()).hexdigest()
    return TargetInfo(config.num_hidden_layers, config.hidden_size, config.vocab_size, sha)


def fingerprint(
    settings: ExtractSettings,
    seqs: list[TrainingSequence],
    info: TargetInfo,
    layers: list[int],
    engine: dict[str, Any] | None = None,
) -> str:
    """What the saved parts depend on; parts from another plan (or backend) are never mixed in."""
    digest = hashlib.sha256()
    for seq in seqs:
        digest.update(json.dumps([seq.id, seq.input_ids, seq.loss_mask]).encode())
    plan = [str(Path(settings.target).resolve()), info.config_sha, layers, settings.dtype]
    plan += [settings.compute_dtype, settings.batch_tokens, digest.hexdigest()]
    if settings.backend != "transformers":  # the transformers plan's fingerprint stays as it was
        plan += [settings.backend, {k: v for k, v in (engine or {}).items() if k != "sources"}]
    return hashlib.sha256(json.dumps(plan).encode()).hexdigest()


def prepare_work(work: Path, key: str) -> Path:
    """The parts folder for plan `key`, emptied when it holds another plan's parts."""
    plan_file = work / "plan.json"
    if plan_file.exists() and json.loads(plan_file.read_text()).get("fingerprint") != key:
        log.info("work folder %s holds another plan's parts: starting afresh", work)
        shutil.rmtree(work)
    parts = work / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    if not plan_file.exists():
        storage.write_json({"fingerprint": key}, plan_file)
    for stale in parts.glob("*.tmp"):
        stale.unlink()
    return parts


def part_path(parts: Path, batch: int) -> Path:
    return parts / f"batch-{batch:05d}.safetensors"


def run_batch(
    model: torch.nn.Module,
    seqs: list[TrainingSequence],
    batch: list[int],
    layers: list[int],
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """Capture one batch; its samples' rows concatenated in batch order, with their indices."""
    states = capture.capture_batch(model, [seqs[i].input_ids for i in batch], layers, dtype)
    return {
        "index": torch.tensor(batch, dtype=torch.int64),
        "aux_hidden_states": torch.cat([aux for aux, _ in states]),
        "final_hidden_states": torch.cat([final for _, final in states]),
    }


class TargetModel:
    """The target, loaded on first use and then shared by every shard a job extracts."""

    def __init__(self) -> None:
        self._model: torch.nn.Module | None = None

    def get(self, settings: ExtractSettings, device: torch.device) -> torch.nn.Module:
        if self._model is None:
            compute_dtype = capture.resolve_compute_dtype(settings.compute_dtype)
            log.info(
                "loading %s (%s on %s%s)",
                settings.target,
                compute_dtype,
                device,
                ", device_map=auto" * settings.device_map,
            )
            self._model = capture.load_target(
                settings.target, compute_dtype, device, settings.device_map, settings.trust_remote_code
            )
        return self._model


def run_batches(
    settings: ExtractSettings,
    seqs: list[TrainingSequence],
    batches: list[list[int]],
    todo: list[int],
    layers: list[int],
    model: torch.nn.Module,
) -> None:
    """Save a part for every batch in `todo`."""
    parts = settings.work / "parts"
    storage_dtype = storage.TORCH_DTYPES[settings.dtype]
    for done, b in enumerate(todo, 1):
        start = time.perf_counter()
        tensors = run_batch(model, seqs, batches[b], layers, storage_dtype)
        io.write_safetensors(tensors, part_path(parts, b))
        tokens = tensors["aux_hidden_states"].shape[0]
        rate = tokens / max(time.perf_counter() - start, 1e-9)
        log.info(
            "batch %d (%d/%d): %d samples, %d tokens, %.0f tokens/s",
            b,
            done,
            len(todo),
            len(batches[b]),
            tokens,
            rate,
        )


def token_counts(seqs: list[TrainingSequence]) -> dict[str, int]:
    """Loss-masked token frequencies (for the draft vocabulary map), keys as strings, sorted by id."""
    counts = Counter(t for seq in seqs for t, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m)
    return {str(t): counts[t] for t in sorted(counts)}


def shard_metadata(
    settings: ExtractSettings,
    seqs: list[TrainingSequence],
    stats: sequences.SequenceStats,
    info: TargetInfo,
    layers: list[int],
    backend: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The shard's metadata (the JSON sibling; all but token_counts also in the safetensors header).

    `backend` holds the vllm backend's keys (`compute_dtype`, `engine`, `final_state_source`); the
    transformers backend's are filled in here.
    """
    itemsize = storage.TORCH_DTYPES[settings.dtype].itemsize
    backend = backend or {
        "compute_dtype": str(capture.resolve_compute_dtype(settings.compute_dtype)).removeprefix("torch."),
        "final_state_source": "transformers decoder stack's last_hidden_state (after its final norm)",
    }
    return {
        "backend": settings.backend,
        "ids": [s.id for s in seqs],
        "num_samples": len(seqs),
        "num_tokens": sum(len(s) for s in seqs),
        "num_loss_tokens": sum(sum(s.loss_mask) for s in seqs),
        "hidden_size": info.hidden_size,
        "num_hidden_layers": info.num_layers,
        "vocab_size": info.vocab_size,
        "aux_layers": layers,
        "aux_layers_vllm": sequences.vllm_layer_ids(layers),
        "layer_numbering": "aux_layers: 0-indexed decoder-layer outputs (HF hidden_states[l+1]); "
        "aux_layers_vllm: vLLM eagle_aux_hidden_state_layer_ids (l+1)",
        "final_state": "post_norm",
        "final_rows": "all",
        "dtype": settings.dtype,
        **backend,
        "target": str(settings.target),
        "token_counts": token_counts(seqs),
        "rows": stats.rows,
        "skipped_status": stats.skipped_status,
        "rebuilt_from_template": stats.rebuilt_from_template,
        "overlong": {
            "policy": settings.overlong,
            "max_seq_len": settings.max_seq_len,
            "truncated": stats.truncated,
            "dropped": stats.dropped,
            "dropped_ids": stats.dropped_ids,
        },
        "floor_bytes_per_token": 4 * info.hidden_size * itemsize,
    }


def write_shard(
    settings: ExtractSettings, seqs: list[TrainingSequence], batches: list[list[int]], meta: dict[str, Any]
) -> None:
    """Stream the parts into the packed shard (trace-row order), validate it, then write the JSON."""
    where: dict[int, tuple[int, int]] = {}  # sample -> (batch, first row in that batch's part)
    for b, batch in enumerate(batches):
        row = 0
        for i in batch:
            where[i] = (b, row)
            row += len(seqs[i])
    parts = {
        b: safe_open(str(part_path(settings.work / "parts", b)), framework="pt") for b in range(len(batches))
    }
    for b, part in parts.items():
        if part.get_tensor("index").tolist() != batches[b]:
            raise storage.ShardError(f"{settings.work}: part {b} holds other samples; delete the work folder")
    lengths = [len(s) for s in seqs]
    dtype = storage.TORCH_DTYPES[settings.dtype]
    writer = storage.PackedShardWriter(
        settings.output, lengths, meta["hidden_size"], dtype, storage.encode_metadata(meta)
    )
    try:
        for name in ("aux_hidden_states", "final_hidden_states"):
            for i, n in enumerate(lengths):
                b, row = where[i]
                writer.write(parts[b].get_slice(name)[row : row + n])
        writer.write_offsets()
        writer.write(torch.tensor([t for s in seqs for t in s.input_ids], dtype=torch.int32))
        writer.write(torch.tensor([m for s in seqs for m in s.loss_mask], dtype=torch.uint8))
    except BaseException:
        writer.abort()
        raise
    writer.close()
    try:
        storage.validate_shard(settings.output, meta["ids"], [s.input_ids for s in seqs], meta["hidden_size"])
    except storage.ShardError:
        settings.output.rename(settings.output.with_name(settings.output.name + ".invalid"))
        raise
    size = settings.output.stat().st_size
    meta["bytes_per_token"] = size / meta["num_tokens"] if meta["num_tokens"] else None
    storage.write_json(meta, settings.metadata)


def extract_shards(jobs: list[ExtractSettings], state: Any = None) -> list[dict[str, Any] | None]:
    """Extract several shards (one per split) with one load of the target; see extract_shard.

    The work folders go only once every shard is written (see the module docstring). The vllm
    backend runs in one process whatever the launcher started (vLLM spreads the target itself).
    """
    if any(settings.backend == "vllm" for settings in jobs):
        return extract_shards_vllm(jobs, state)
    from accelerate import PartialState

    state = state or PartialState()
    target = TargetModel()
    metas = [extract_shard(settings, state, target, keep_work=True) for settings in jobs]
    if state.is_main_process:
        for settings in jobs:
            shutil.rmtree(settings.work, ignore_errors=True)
    return metas


@dataclass
class ShardPlan:
    """One shard's sequences and batches, before any state is computed."""

    settings: ExtractSettings
    info: TargetInfo
    layers: list[int]
    seqs: list[TrainingSequence]
    stats: sequences.SequenceStats
    batches: list[list[int]]


def plan_shard(settings: ExtractSettings) -> ShardPlan:
    """Read the shard's trace rows and build its sequences and batches (both backends).

    Raises:
        sequences.SequenceError: bad trace rows or settings.
    """
    info = target_info(settings.target, settings.trust_remote_code)
    layers = sequences.resolve_layers(settings.layers, info.num_layers)
    rows = sequences.load_trace_rows(settings.traces, settings.shard)
    seqs, stats = sequences.build_sequences(
        rows, settings.max_seq_len, settings.overlong, _tokenizer_loader(settings)
    )
    batches = sequences.longest_first_batches([len(s) for s in seqs], settings.batch_tokens)
    log.info(
        "shard %d: %d rows -> %d sequences, %d tokens, %d batches; aux layers %s (vLLM ids %s)",
        settings.shard,
        len(rows),
        len(seqs),
        sum(map(len, seqs)),
        len(batches),
        layers,
        sequences.vllm_layer_ids(layers),
    )
    return ShardPlan(settings, info, layers, seqs, stats, batches)


def finish_shard(plan: ShardPlan, keep_work: bool, backend: dict[str, Any] | None = None) -> dict[str, Any]:
    """Pack the saved parts into the shard, validate it, write its JSON; returns the metadata."""
    settings = plan.settings
    meta = shard_metadata(settings, plan.seqs, plan.stats, plan.info, plan.layers, backend)
    write_shard(settings, plan.seqs, plan.batches, meta)
    if not keep_work:
        shutil.rmtree(settings.work, ignore_errors=True)
    log.info(
        "wrote %s: %d samples, %d tokens, %s bytes/token (floor %d)",
        settings.output,
        meta["num_samples"],
        meta["num_tokens"],
        meta["bytes_per_token"],
        meta["floor_bytes_per_token"],
    )
    return meta


def extract_shard(
    settings: ExtractSettings, state: Any = None, target: TargetModel | None = None, keep_work: bool = False
) -> dict[str, Any] | None:
    """Extract one trace shard's hidden states; returns the metadata on the main process, else None.

    Args:
        settings: the job.
        state: an `accelerate.PartialState` (made here when None).
        target: the target model shared with the job's other shards (loaded here when needed).
        keep_work: leave the saved parts in the work folder (extract_shards removes them at the end).

    Raises:
        sequences.SequenceError: bad trace rows or settings.
        storage.ShardError: the written shard failed validation (kept as `*.invalid`).
    """
    if settings.backend == "vllm":
        return extract_shards_vllm([settings], state, keep_work=keep_work)[0]
    from accelerate import PartialState

    state = state or PartialState()
    if settings.device_map and not state.is_main_process:
        log.info("device_map placement: rank %d has nothing to do", state.process_index)
        return None
    world, rank = (1, 0) if settings.device_map else (state.num_processes, state.process_index)
    plan = plan_shard(settings)
    if state.is_main_process:
        prepare_work(settings.work, fingerprint(settings, plan.seqs, plan.info, plan.layers))
    if world > 1:
        state.wait_for_everyone()
    parts = settings.work / "parts"
    todo = [b for b in range(len(plan.batches)) if b % world == rank and not part_path(parts, b).exists()]
    log.info(
        "rank %d/%d: %d batches to run, %d already saved",
        rank,
        world,
        len(todo),
        len(plan.batches[rank::world]) - len(todo),
    )
    if todo:
        model = (target or TargetModel()).get(settings, state.device)
        run_batches(settings, plan.seqs, plan.batches, todo, plan.layers, model)
    if world > 1:
        state.wait_for_everyone()
    if not state.is_main_process:
        return None
    return finish_shard(plan, keep_work)


def extract_shards_vllm(
    jobs: list[ExtractSettings], state: Any = None, keep_work: bool = False
) -> list[dict[str, Any] | None]:
    """The vllm backend: every split's missing batches through one vLLM engine, then pack each shard.

    Only the main process works (vLLM starts its own tensor-parallel workers). Parts are the
    transformers backend's, so resume and packing are shared; the plan fingerprint includes the backend
    and the engine settings, so parts of another backend or engine are never mixed in.

    Raises:
        vllm_backend.VllmBackendError: no interpreter with vLLM, a bad setting, or the engine failed.
        final_norm.FinalNormError: the target's final norm cannot be rebuilt (use transformers).
    """
    from eagle3_pipeline.hidden_states import final_norm, vllm_backend

    if state is not None and not state.is_main_process:
        log.info("vllm backend: rank %d has nothing to do", state.process_index)
        return [None] * len(jobs)
    first = jobs[0]
    options = vllm_backend.vllm_options(first.vllm)
    snapshot = vllm_backend.read_snapshot(first.server_json)
    engine = vllm_backend.engine_settings(options, snapshot, first.max_seq_len, first.batch_tokens)
    log.info(
        "vLLM engine settings: %s (from %s)",
        {k: v for k, v in engine.items() if k != "sources"},
        engine["sources"],
    )
    norm = final_norm.find_final_norm(first.target)
    plans = [plan_shard(settings) for settings in jobs]
    batches: list[dict[str, Any]] = []
    for plan in plans:
        key = fingerprint(plan.settings, plan.seqs, plan.info, plan.layers, engine)
        parts = prepare_work(plan.settings.work, key)
        todo = [b for b in range(len(plan.batches)) if not part_path(parts, b).exists()]
        saved = len(plan.batches) - len(todo)
        log.info("%s: %d batches to run, %d already saved", plan.settings.output, len(todo), saved)
        batches += [
            {
                "part": str(part_path(parts, b)),
                "index": plan.batches[b],
                "input_ids": [plan.seqs[i].input_ids for i in plan.batches[b]],
            }
            for b in todo
        ]
    layer_ids = sequences.vllm_layer_ids(plans[0].layers) + [plans[0].info.num_layers]
    if batches:
        python = vllm_backend.resolve_python(options, snapshot)
        records = [str(plan.settings.work / "engine.json") for plan in plans]
        spec = {
            "engine": engine,
            "layer_ids": layer_ids,
            "final_norm": norm.as_dict(),
            "hidden_size": plans[0].info.hidden_size,
        }
        run_on_engine(first, options, snapshot, python, spec, {"batches": batches, "records": records})
    metas: list[dict[str, Any] | None] = []
    for plan in plans:
        record_path = plan.settings.work / "engine.json"
        record = json.loads(record_path.read_text()) if record_path.exists() else None
        requested = {k: v for k, v in engine.items() if k != "sources"}
        backend = {
            "compute_dtype": (record or requested)["dtype"],
            "engine": record or {**requested, "layer_ids": layer_ids, "ran": False},
            "final_state_source": f"vLLM id {plan.info.num_layers} (before the final norm), then the "
            f"target's final RMSNorm ({norm.key}, eps {norm.eps}) applied in float32",
        }
        metas.append(finish_shard(plan, keep_work=True, backend=backend))
    if not keep_work:
        for settings in jobs:
            shutil.rmtree(settings.work, ignore_errors=True)
    return metas


def run_on_engine(
    settings: ExtractSettings,
    options: Any,
    snapshot: dict[str, Any] | None,
    python: str,
    spec: dict[str, Any],
    request: dict[str, Any],
) -> dict[str, Any]:
    """Run a job's batches on its extraction engine (started when none runs), waiting for every part.

    The engine is the one of `settings.engine_dir`, shared with the other jobs of its scope and
    stopped by rule stop_extraction_engine; with no engine_dir, or inside a SLURM allocation (where
    an engine cannot outlive the job), a private one stopped when this returns.

    Raises:
        engine.EngineError: the engine failed to start, or died (the parts saved are kept).
    """
    import os
    import tempfile

    from eagle3_pipeline.hidden_states import engine as engine_service
    from eagle3_pipeline.hidden_states import vllm_backend

    private = settings.engine_dir is None or "SLURM_JOB_ID" in os.environ
    scratch = None
    if settings.engine_dir is None:
        scratch = tempfile.TemporaryDirectory(prefix="eagle3-engine-")
        directory = Path(scratch.name)
    elif "SLURM_JOB_ID" in os.environ:
        directory = Path(settings.engine_dir) / f"slurm-{os.environ['SLURM_JOB_ID']}"
    else:
        directory = Path(settings.engine_dir)
    window = vllm_backend.in_flight_tokens(options, spec["engine"])
    full = vllm_backend.engine_spec(
        settings.target,
        spec["engine"],
        spec["layer_ids"],
        settings.dtype,
        spec["final_norm"],
        vllm_backend.staging_dir(options, directory, window, spec["hidden_size"]),
        window,
        options.idle_timeout_s,
        mode=os.environ.get("EAGLE3_ENGINE_MODE", "stream"),  # "drain": the benchmark's before
    )
    if settings.engine_log and not private:
        full["log"] = str(settings.engine_log)
    directory.mkdir(parents=True, exist_ok=True)
    env = vllm_backend.worker_env(vllm_backend.package_path(directory), snapshot)
    try:
        info = engine_service.start_or_join(directory, python, full, env)
        # queued before the engine is ready: it takes the batches as soon as it is, with no wait
        name = engine_service.enqueue(directory, request)
        log.info("extraction engine %s: %d batches queued", info["start_id"], len(request["batches"]))
        done = engine_service.wait_done(directory, info, name)
        log.info("extraction engine %s: %d tokens in %.1f s", info["start_id"], done["tokens"], done["s"])
        return done
    finally:
        if private:
            log.info("private engine: %s", engine_service.stop_engine(directory))
        if scratch is not None:
            scratch.cleanup()


def _tokenizer_loader(settings: ExtractSettings):
    def load() -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            str(settings.target), trust_remote_code=settings.trust_remote_code
        )

    return load
