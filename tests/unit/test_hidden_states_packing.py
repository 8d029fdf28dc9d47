"""Committing a packed shard (packing.commit_shard): a rename from the work folder, never a copy (a shard
is on disk once: planning/window_plan.py); a hard link when the work folder is kept; a copy only across
filesystems.
The pack slots (packing.pack_slot): at most hidden_states.pack_slots processes pack at once, as
planning.window_plan.pack_reserve counts."""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3_pipeline.hidden_states import packing
from eagle3_pipeline.hidden_states.job import ShardJob


def _job(tmp_path: Path) -> ShardJob:
    job = ShardJob(
        Path("t.parquet"), 0, tmp_path, tmp_path / "hs" / "shard-00000.safetensors",
        tmp_path / "hs" / "shard-00000.json", tmp_path / "work",
    )  # fmt: skip
    job.work.mkdir()
    packing.packed_path(job).write_bytes(b"states")
    return job


def test_a_packed_shard_is_renamed_into_its_output(tmp_path):
    job = _job(tmp_path)
    inode = packing.packed_path(job).stat().st_ino
    packing.commit_shard(job, {"num_samples": 1})
    assert job.output.stat().st_ino == inode and not packing.packed_path(job).exists()
    assert json.loads(job.metadata.read_text()) == {"num_samples": 1}


def test_a_kept_work_folder_shares_the_bytes(tmp_path):
    job = _job(tmp_path)
    packing.commit_shard(job, {}, keep_work=True)
    assert job.output.stat().st_ino == packing.packed_path(job).stat().st_ino  # one copy, two names


def test_across_filesystems_the_shard_is_copied_then_removed(tmp_path, monkeypatch):
    job = _job(tmp_path)
    packed, real_replace = packing.packed_path(job), os.replace

    def cross_device(src: os.PathLike, dst: os.PathLike) -> None:
        if Path(src) == packed:  # work/ and the outputs on two filesystems
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_replace(src, dst)  # the copy's own atomic rename, beside the output

    monkeypatch.setattr(os, "replace", cross_device)
    packing.commit_shard(job, {})
    assert job.output.read_bytes() == b"states" and not packed.exists()


def _pack(folder: str, slots: int, hold_s: float, log: str) -> None:
    """One process packing in a slot: its slot and when it held it, one line appended to `log`."""
    with packing.pack_slot(Path(folder), slots) as slot:
        start = time.time()
        time.sleep(hold_s)
        end = time.time()
    with open(log, "a") as handle:
        handle.write(f"{slot} {start} {end}\n")


def test_at_most_pack_slots_processes_pack_at_once(tmp_path):
    fork = multiprocessing.get_context("fork")  # separate processes, each its own lock files opened
    log = tmp_path / "held.log"
    procs = [fork.Process(target=_pack, args=(str(tmp_path / "slots"), 2, 1.0, str(log))) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    lines = (line.split() for line in log.read_text().splitlines())
    held = [(int(slot), float(a), float(b)) for slot, a, b in lines]
    assert len(held) == 4 and {slot for slot, _, _ in held} <= {0, 1}
    # at every start, how many held a slot: never more than 2, and 2 did (the slots were used)
    at_once = [sum(a <= start < b for _, a, b in held) for _, start, _ in held]
    assert max(at_once) == 2
    assert sorted(os.listdir(tmp_path / "slots")) == ["slot-0", "slot-1"]


def test_a_slot_frees_when_its_holder_exits_however_it_exits(tmp_path):
    fork = multiprocessing.get_context("fork")

    def die_in_slot() -> None:
        with packing.pack_slot(tmp_path, 1):
            os._exit(3)  # killed mid-packing: no finally runs, the kernel drops the lock

    proc = fork.Process(target=die_in_slot)
    proc.start()
    proc.join(timeout=30)
    assert proc.exitcode == 3
    with packing.pack_slot(tmp_path, 1) as slot:  # at once, not waiting forever
        assert slot == 0


def test_no_folder_no_slot_and_a_filesystem_without_flock_is_named(tmp_path, monkeypatch):
    with packing.pack_slot(None, 1) as slot:
        assert slot is None

    def refuse(handle: object, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(packing.PackSlotError, match="must support flock"), packing.pack_slot(tmp_path, 2):
        pass


def test_a_shard_is_packed_holding_a_slot(tmp_path, monkeypatch):
    folder = tmp_path / "slots"
    seen = []

    def write_shard(hidden_states: object, plan: object, meta: dict) -> Path:
        handle = open(folder / "slot-0", "a")  # noqa: SIM115 - another open file description
        with pytest.raises(BlockingIOError):  # the only slot is held while the parts are moved
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        handle.close()
        seen.append(meta)
        return tmp_path / "packed.safetensors"

    meta = {"num_samples": 1, "num_tokens": 2, "bytes_per_token": 3, "floor_bytes_per_token": 4}
    monkeypatch.setattr(packing, "shard_metadata", lambda *args: dict(meta))
    monkeypatch.setattr(packing, "write_shard", write_shard)
    plan = SimpleNamespace(job=SimpleNamespace(pack_dir=folder, output=tmp_path / "out.safetensors"))
    settings = SimpleNamespace(pack_slots=1)
    assert packing.finish_shard(settings, plan) == meta and seen == [meta]
    with packing.pack_slot(folder, 1) as slot:  # given back once packed
        assert slot == 0


def test_an_error_of_the_packing_itself_is_not_taken_for_a_lock_failure(tmp_path):
    # a full disk while the parts are moved is that error, not "the filesystem must support flock"
    with pytest.raises(OSError) as raised, packing.pack_slot(tmp_path, 1):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert raised.type is OSError and raised.value.errno == errno.ENOSPC
