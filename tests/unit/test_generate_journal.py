"""Journal: resume, torn last line, params hash, failures retried, one writer."""

import json

import pytest

from eagle3_pipeline.generate.journal import Journal, JournalBusy, params_hash


def ok(n):
    return {"status": "ok", "reason": None, "content": f"a{n}"}


def test_resume_reuses_finished_results(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path, "p1") as journal:
        journal.append("a", ok(1))
        journal.append("b", {"status": "skipped", "reason": "too long"})
    with Journal(path, "p1") as journal:
        assert journal.finished("a") == ok(1)
        assert journal.finished("b")["status"] == "skipped"
        assert journal.finished("c") is None


def test_torn_last_line_is_cut_and_appends_stay_valid(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path, "p") as journal:
        journal.append("a", ok(1))
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"id": "b", "params": "p", "result": {"sta')  # killed mid-write
    with Journal(path, "p") as journal:
        assert journal.finished("a") == ok(1) and journal.finished("b") is None
        journal.append("b", ok(2))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [entry["id"] for entry in lines] == ["a", "b"]


def test_changed_params_are_not_reused(tmp_path):
    path = tmp_path / "j.jsonl"
    first = params_hash({"max_tokens": 64, "temperature": 0.6})
    assert first == params_hash({"temperature": 0.6, "max_tokens": 64})
    with Journal(path, first) as journal:
        journal.append("a", ok(1))
    second = params_hash({"max_tokens": 128, "temperature": 0.6})
    with Journal(path, second) as journal:
        assert journal.finished("a") is None and journal.stale == 1
    with Journal(path, first) as journal:
        assert journal.finished("a") == ok(1)


def test_failed_is_retried_and_a_later_success_wins(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path, "p", fsync_interval_s=0) as journal:
        journal.append("a", {"status": "failed", "reason": "HTTP 500"})
    with Journal(path, "p") as journal:
        assert journal.finished("a") is None
        journal.append("a", ok(1))
        journal.append("a", {"status": "failed", "reason": "late"})  # never replaces a final outcome
    with Journal(path, "p") as journal:
        assert journal.finished("a") == ok(1)


def test_a_second_writer_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path, "p"), pytest.raises(JournalBusy, match="another process"):
        Journal(path, "p")


def test_lines_are_handed_to_the_disk_on_the_stated_schedule(tmp_path, monkeypatch):
    """What a power cut may lose is bounded by fsync_interval_s: every line is fsynced at 0, none between
    syncs at a long interval, and whatever is still dirty at close. (The durability itself needs a real
    power cut to show; this pins the calls that give it, on the journal's own descriptor.)"""
    import os

    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    with Journal(tmp_path / "every.jsonl", params_hash({"m": 1}), fsync_interval_s=0) as journal:
        for i in range(3):
            journal.append(f"q{i}", {"status": "ok"})
        assert synced == [journal._fd] * 3
    assert len(synced) == 3  # nothing dirty at close: no fourth call
    synced.clear()
    with Journal(tmp_path / "batched.jsonl", params_hash({"m": 1}), fsync_interval_s=3600) as journal:
        fd = journal._fd
        for i in range(3):
            journal.append(f"q{i}", {"status": "ok"})
        assert synced == []  # within the interval: written (os.write), not yet synced
    assert synced == [fd]  # close syncs what the interval held back
