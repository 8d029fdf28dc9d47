"""hidden_states.kept: a finished shard survives Snakemake's removal of its failed group's outputs, is
taken back by the rerun of the same plan (the same file), and its links go once the group is done."""

from __future__ import annotations

import os
from pathlib import Path

from eagle3_pipeline.hidden_states import kept
from eagle3_pipeline.hidden_states.job import ShardJob


def _committed(tmp_path: Path, split: str = "train") -> ShardJob:
    out = tmp_path / "results" / "hidden_states" / split
    out.mkdir(parents=True)
    job = ShardJob(
        traces=tmp_path / "t.parquet", shard=3, target=tmp_path, output=out / "shard-00003.safetensors",
        metadata=out / "shard-00003.json", work=tmp_path / "work" / split,
    )  # fmt: skip
    job.output.write_bytes(b"states")
    job.metadata.write_text('{"num_samples": 2}')
    return job


def test_a_kept_shard_is_taken_back_by_the_same_plan_as_the_same_file(tmp_path):
    engine_dir, job = tmp_path / "engine", _committed(tmp_path)
    kept.keep(engine_dir, job, "plan-a")
    inode, mtime = job.output.stat().st_ino, job.output.stat().st_mtime_ns
    job.output.unlink()  # Snakemake's cleanup of a failed group
    job.metadata.unlink()
    assert kept.restore(engine_dir, job, "plan-a") == {"num_samples": 2}
    assert job.output.read_bytes() == b"states" and job.metadata.exists()
    assert (job.output.stat().st_ino, job.output.stat().st_mtime_ns) == (inode, mtime)  # untouched


def test_a_shard_kept_by_another_plan_is_dropped_and_extracted_again(tmp_path):
    engine_dir, job = tmp_path / "engine", _committed(tmp_path)
    kept.keep(engine_dir, job, "plan-a")
    job.output.unlink()
    assert kept.restore(engine_dir, job, "plan-b") is None  # changed settings: not these states
    assert not job.output.exists() and not list((engine_dir / kept.KEPT_DIR).iterdir())
    assert kept.restore(engine_dir, job, "plan-a") is None  # nothing kept any more


def test_the_links_cost_no_disk_and_go_once_every_client_finished(tmp_path):
    engine_dir, job = tmp_path / "engine", _committed(tmp_path)
    kept.joined(engine_dir, "start-1")
    kept.keep(engine_dir, job, "plan-a")
    assert job.output.stat().st_nlink == 2  # a hard link, not a copy
    # SIGTERM while this client has not finished (SLURM's preemption): the links stay for the rerun
    assert kept.unfinished(engine_dir, "start-1") == [f"{os.uname().nodename}-{os.getpid()}"]
    assert not kept.release(engine_dir, "start-1") and job.output.stat().st_nlink == 2
    kept.finished(engine_dir)
    assert kept.release(engine_dir, "start-1")  # Snakemake ended the engine after every client
    assert job.output.stat().st_nlink == 1 and not (engine_dir / kept.KEPT_DIR).exists()
