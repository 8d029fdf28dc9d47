"""One generation shard: every question of a prompt shard sent to the server, journaled, then written.

`generate_shard` is the rule's entry (it starts the server through the lifecycle API when needed);
`run_generation` is the test seam (a base URL in, the output table out). Workers each hold one slot of
the global cap (slots.py) and share the job's aiohttp session; a manager tops the workers up while
slots are free and work is pending. The output is written atomically after checking ok + skipped +
failed = prompts. A server outage (ServerUnavailable) and a shard whose every request failed raise
instead: nothing is written, the journal keeps what finished, and the rerun sends only the rest.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from tqdm import tqdm

from eagle3_pipeline.generate.client import ChatClient, ServerUnavailable, outcome
from eagle3_pipeline.generate.journal import Journal, params_hash
from eagle3_pipeline.generate.payload import Sampling, request_seed
from eagle3_pipeline.generate.slots import SlotPool
from eagle3_pipeline.prompts import PROMPT_SCHEMA, write_parquet
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import GenerationSettings, ServerSettings

if TYPE_CHECKING:
    from eagle3_pipeline.server.replicas import Server

log = logging.getLogger(__name__)

SLOT_POLL_S = 0.01  # while work waits for a slot: a freed slot idles at most this long (one flock per slot)
# How often a job recounts the jobs waiting for slots (its fair share): when the others finish, the
# last job may take every slot within this time (0.5 s left slots idle at the end of a run)
SHARE_CHECK_S = 0.05

# the prompt's columns (shard after id), then what the server wrote
OUTPUT_SCHEMA = {
    "id": PROMPT_SCHEMA["id"],
    "shard": pl.Int32,
    **{name: dtype for name, dtype in PROMPT_SCHEMA.items() if name != "id"},
    "reasoning": pl.String,
    "content": pl.String,
    "finish_reason": pl.String,
    "prompt_token_ids": pl.List(pl.Int32),
    "completion_token_ids": pl.List(pl.Int32),
    "prompt_tokens": pl.Int32,
    "completion_tokens": pl.Int32,
    "status": pl.String,
    "reason": pl.String,
    "latency_s": pl.Float64,
    "max_tokens": pl.Int32,
    "temperature": pl.Float64,
    "top_p": pl.Float64,
    "seed": pl.Int64,
    "server_identity": pl.String,
}


class _LogStream:
    """A file-like object that sends tqdm's bar to the log, one line per refresh."""

    def write(self, text: str) -> None:
        text = text.strip("\r\n ")
        if text:
            log.info("%s", text)

    def flush(self) -> None:
        pass


class _Progress:
    """tqdm bar (req/s, ETA) with completion tok/s in its postfix, refreshed at most every interval."""

    def __init__(self, total: int, done: int, shard: int, interval: float) -> None:
        self.bar = tqdm(
            total=total,
            initial=done,
            desc=f"shard {shard:05d}",
            unit="req",
            file=_LogStream(),
            mininterval=interval,
            ascii=True,
            ncols=100,
        )
        self.tokens, self.start = 0, time.monotonic()
        self.counts: Counter[str] = Counter()

    def update(self, result: dict[str, Any]) -> None:
        self.counts[result["status"]] += 1
        self.tokens += result["completion_tokens"] or 0
        rate = self.tokens / max(time.monotonic() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{rate:.0f} tok/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class _Workers:
    """Runs the pending work units with at most `concurrency` workers, each holding one global slot.

    A unit is one question, or with `generation.history: own` one conversation (its turns in order,
    each sent with the target's own earlier answers); units run concurrently, turns in sequence.
    """

    def __init__(
        self, client: ChatClient, pool: SlotPool, concurrency: int, journal: Journal, progress
    ) -> None:
        self.client, self.pool, self.concurrency = client, pool, concurrency
        self.journal, self.progress = journal, progress
        self.share = pool.total

    async def run(self, pending: list[list[dict[str, Any]]]) -> None:
        queue = deque(pending)
        tasks: set[asyncio.Task[None]] = set()
        last_share_check = 0.0
        try:
            while queue or tasks:
                if time.monotonic() - last_share_check > SHARE_CHECK_S:
                    last_share_check = time.monotonic()
                    self.share = math.ceil(self.pool.total / (1 + self.pool.others_wanting()))
                while queue and len(tasks) < min(self.concurrency, self.share):
                    slot = self.pool.try_acquire()
                    if slot is None:
                        break
                    tasks.add(asyncio.create_task(self._worker(slot, queue.popleft(), queue)))
                waiting = bool(queue) and len(tasks) < min(self.concurrency, self.share)
                self.pool.set_wanting(bool(queue) and len(tasks) < self.concurrency)
                if tasks:
                    # poll often only while work waits for a slot another job may free
                    timeout = SLOT_POLL_S if waiting else 0.2
                    done, tasks = await asyncio.wait(
                        tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in done:
                        task.result()  # ServerUnavailable ends the job here; the journal keeps the rest
                else:
                    await asyncio.sleep(SLOT_POLL_S)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.pool.set_wanting(False)

    async def _worker(
        self, slot: int, unit: list[dict[str, Any]], queue: deque[list[dict[str, Any]]]
    ) -> None:
        try:
            while True:
                await self._unit(unit)
                if not queue or self.pool.held > self.share:
                    return  # give the slot back: no work left, or another job waits for its share
                unit = queue.popleft()
        finally:
            self.pool.release(slot)

    async def _unit(self, unit: list[dict[str, Any]]) -> None:
        """The turns of one unit in order; with history, each after the answers before it."""
        history: list[dict[str, str]] = []
        blocked: str | None = None  # the status of an earlier turn that got no answer
        for item in unit:
            result = self.journal.finished(item["id"])
            if result is None and blocked is not None:
                # nothing to send: the conversation cannot go on without that turn's answer
                result = outcome(
                    blocked, f"an earlier turn of this conversation is {blocked}", time.perf_counter()
                )
                self.journal.append(item["id"], result)
                self.progress.update(result)
            elif result is None:
                result = await self._turn(item, history if len(unit) > 1 else None)
            if result["status"] != "ok":
                blocked = blocked or result["status"]
            else:
                history += [
                    {"role": "user", "content": item["question"]},
                    {"role": "assistant", "content": result["content"] or ""},
                ]

    async def _turn(self, item: dict[str, Any], history: list[dict[str, str]] | None) -> dict[str, Any]:
        result = await self.client.complete(item, history)
        self.journal.append(item["id"], result)
        self.progress.update(result)
        return result


def _prompt_records(prompts: pl.DataFrame) -> list[dict[str, Any]]:
    records = prompts.to_dicts()
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt shard has duplicate ids; rerun prepare_prompts")
    return records


def output_frame(
    records: list[dict], results: dict[str, dict], shard: int, sampling: Sampling, identity: str
) -> pl.DataFrame:
    """The shard's output table, one row per prompt in prompt order (built by column: fast)."""
    ordered = [results[record["id"]] for record in records]
    constant = {
        "shard": shard,
        "server_identity": identity,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    columns = {}
    for name, dtype in OUTPUT_SCHEMA.items():
        if name in constant:
            values = [constant[name]] * len(records)
        elif name == "seed":
            values = [request_seed(sampling.seed, record["id"]) for record in records]
        elif name in PROMPT_SCHEMA:
            values = [record[name] for record in records]
        else:
            values = [result.get(name) for result in ordered]
        columns[name] = pl.Series(name, values, dtype=dtype)
    return pl.DataFrame(columns)


def work_units(records: list[dict[str, Any]], history: str) -> list[list[dict[str, Any]]]:
    """What one worker sends in sequence: each question alone, or with history `own` each
    conversation (the questions of one dataset row, by turn) so that a turn follows the answers
    before it."""
    if history != "own":
        return [[record] for record in records]
    conversations: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        conversations.setdefault(record["row"], []).append(record)
    return [sorted(turns, key=lambda r: r["turn"]) for turns in conversations.values()]


def run_generation(
    prompts: pl.DataFrame,
    base_url: str | Callable[[], str],
    sampling: Sampling,
    generation: GenerationSettings,
    journal_path: str | os.PathLike[str],
    identity: str,
    shard: int = 0,
    api_key: str | None = None,
    health_timeout_s: float = 1800.0,
    slots_dir: str | os.PathLike[str] | None = None,
    progress_interval_s: float = 10.0,
    revive: Callable[[], object] | None = None,
    ca_bundle: str | None = None,
) -> pl.DataFrame:
    """Generate every prompt not already in the journal and return the complete shard table.

    Args:
        prompts: a prompt shard (prompts.PROMPT_SCHEMA).
        base_url: the server, e.g. http://127.0.0.1:8000, or a callable giving it (called only when
            something is left to send, so that a finished shard never starts a server).
        sampling: model and sampling parameters.
        generation: read for its pacing (concurrency, global_concurrency, retries,
            request_timeout_s) and history; `sampling` is what is sent.
        journal_path: the shard's journal under results/{run}/work/.
        identity: the server identity hash (server.json "identity"); part of the journal's params hash.
        health_timeout_s: how long the server may stay down (server.start_timeout_s).
        slots_dir: the global-cap slot folder shared by parallel shard jobs (default: next to the journal).
        revive: starts a managed server again when it stays down mid-shard (None: only wait for it).
        ca_bundle: PEM bundle trusted for an https server (None: the system's).

    Raises:
        ServerUnavailable: the server stayed down longer than health_timeout_s, or transient errors
            outlasted the retries: nothing is written, the journal keeps what finished.
        RuntimeError: every request of a non-empty shard failed (wrong model name...).
    """
    records = _prompt_records(prompts)
    history = generation.history
    shaping: dict[str, Any] = {"sampling": sampling.identity(), "identity": identity}
    if history == "own":
        shaping["history"] = history  # later turns carry the target's own answers
    slots_dir = slots_dir or Path(journal_path).parent / "slots"
    with Journal(journal_path, params_hash(shaping)) as journal:
        pending = [
            u for u in work_units(records, history) if any(journal.finished(r["id"]) is None for r in u)
        ]
        reused = sum(journal.finished(r["id"]) is not None for r in records)
        log.info(
            "shard %05d: %d prompts, %d finished in the journal, %d to send (%d stale journal lines)",
            shard,
            len(records),
            reused,
            len(records) - reused,
            journal.stale,
        )
        start = time.monotonic()
        progress = _Progress(len(records), reused, shard, progress_interval_s)
        try:
            if pending:
                base_url = base_url() if callable(base_url) else base_url
                client = ChatClient(
                    base_url,
                    sampling,
                    api_key=api_key,
                    retries=generation.retries,
                    request_timeout_s=generation.request_timeout_s,
                    health_timeout_s=health_timeout_s,
                    revive=revive,
                    concurrency=generation.concurrency,
                    ca_bundle=ca_bundle,
                )
                asyncio.run(_generate(pending, client, generation, slots_dir, journal, progress))
        except ServerUnavailable as error:
            done = sum(journal.finished(r["id"]) is not None for r in records)
            raise ServerUnavailable(
                f"shard {shard:05d}: the server is unavailable ({error}); {done} of {len(records)} "
                f"prompts are finished in {journal_path}, and a rerun sends only the rest"
            ) from error
        finally:
            progress.close()
        results = {r["id"]: journal.results[r["id"]] for r in records}
    _summarise(shard, results, reused, time.monotonic() - start, progress.tokens)
    counts = Counter(r["status"] for r in results.values())
    assert counts["ok"] + counts["skipped"] + counts["failed"] == len(records), counts
    if records and counts["failed"] == len(records):
        reasons = Counter(r["reason"] for r in results.values()).most_common(3)
        raise RuntimeError(f"shard {shard:05d}: all {len(records)} requests failed: {reasons}")
    return output_frame(records, results, shard, sampling, identity)


async def _generate(
    pending: list[list[dict[str, Any]]],
    client: ChatClient,
    generation: GenerationSettings,
    slots_dir: str | os.PathLike[str],
    journal: Journal,
    progress: _Progress,
) -> None:
    pool = SlotPool(slots_dir, generation.global_concurrency)
    try:
        await _Workers(client, pool, generation.concurrency, journal, progress).run(pending)
    finally:
        pool.close()
        await client.close()


def _summarise(shard: int, results: dict[str, dict], reused: int, seconds: float, new_tokens: int) -> None:
    values = list(results.values())
    status = Counter(r["status"] for r in values)
    finish = Counter(r["finish_reason"] for r in values if r["status"] == "ok")
    sent = len(values) - reused
    latencies = sorted(r["latency_s"] for r in values if r["status"] == "ok")
    median = latencies[len(latencies) // 2] if latencies else 0.0
    log.info(
        "shard %05d summary: %d prompts: ok %d, skipped %d, failed %d (%d reused from the journal); "
        "finish %s; %d sent in %.1f s = %.2f req/s, %.0f completion tok/s; median latency %.2f s",
        shard,
        len(values),
        status["ok"],
        status["skipped"],
        status["failed"],
        reused,
        dict(finish),
        sent,
        seconds,
        sent / max(seconds, 1e-9),
        new_tokens / max(seconds, 1e-9),
        median,
    )
    for reason, count in Counter(r["reason"] for r in values if r["reason"]).most_common(5):
        log.info("shard %05d: %d x %s", shard, count, reason[:300])


# Same writer as the prompt shards: atomic, and byte-identical for identical content.
write_output = write_parquet


def generate_shard(
    prompts_path: str,
    output_path: str,
    server_json_path: str,
    server: ServerSettings,
    generation: GenerationSettings,
    journal_path: str,
    state_dir: str,
    shard: int,
    replica: Server | None = None,
) -> None:
    """The generate_shard rule: ensure the server runs, generate the shard, write it atomically.

    `replica` is the server this shard is sent to; None or the primary: `server`. The journal and the
    output carry the primary's identity either way (a replica is checked identical to it by rule
    check_replica), so the shard does not depend on which one wrote it.
    """
    from eagle3_pipeline import secrets
    from eagle3_pipeline.server import api_key
    from eagle3_pipeline.server.lifecycle import ensure_running

    snapshot = ServerSnapshot.load(server_json_path)
    secrets.learn(snapshot)  # the unit's secrets, hidden in this job's log, errors and reasons
    target_snapshot, target, target_state, slots_dir = snapshot, server, state_dir, None
    if replica is not None and not replica.primary:
        target_snapshot = ServerSnapshot.load(replica.server_json)
        secrets.learn(target_snapshot)
        target, target_state, slots_dir = replica.settings, replica.state_dir, replica.slots_dir
    if replica is not None:
        log.info("shard %05d is sent to server %s", shard, replica.name)
    prompts = pl.read_parquet(prompts_path)
    start_server = partial(ensure_running, target_snapshot, target, Path(target_state))
    sampling = Sampling.from_settings(generation, snapshot.request_model)
    frame = run_generation(
        prompts,
        start_server,  # only when some request is left to send
        sampling,
        generation,
        journal_path,
        identity=snapshot.identity,
        shard=shard,
        api_key=api_key(target),
        health_timeout_s=target.start_timeout_s,
        slots_dir=slots_dir,  # the global cap per server (None: the primary's, next to the journal)
        # a managed server that dies mid-shard is started again (systemd would, with Restart=)
        revive=start_server if target.manage else None,
        ca_bundle=target.ca_bundle,
    )
    write_output(frame, output_path)
