"""Committing a packed shard (packing.commit_shard): a rename from the work folder, never a copy (a shard
is on disk once: budget.py); a hard link when the work folder is kept; a copy only across filesystems."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

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
