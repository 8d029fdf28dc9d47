"""The serve check's seam (validate/draft_serving.py): the server backend decides how the draft is
served, once (server/backend.py); serve_check.py serves and times through it without asking which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.server import backend
from eagle3_pipeline.server.backend import ServerBackend
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import GenerationSettings, ServerSettings, ValidateSettings
from eagle3_pipeline.validate import draft_serving
from eagle3_pipeline.validate.draft_serving import (
    SERVING,
    SPEEDUP_OFF,
    DraftServing,
    LocalDraftServing,
    ProductionDraftServing,
    ServeCheckRun,
)

LOCAL = ServerSettings(host="local", unit_file="/etc/vllm.service")


def _run(tmp_path: Path, questions: int = 2) -> ServeCheckRun:
    asked = [{"id": f"q{i}", "system": None, "question": "?", "source": "math"} for i in range(questions)]
    return ServeCheckRun(
        checkpoint_dir=tmp_path / "ckpt", questions=asked, sampling=Sampling("demo", 8, 0.0),
        state_dir=tmp_path / "work", concurrency=2, request_timeout_s=30.0,
    )  # fmt: skip


def test_every_server_backend_serves_the_draft_its_own_way():
    assert set(ServerBackend.__subclasses__()) == set(SERVING)


@pytest.mark.parametrize(
    ("server", "systemd", "expected"),
    [
        (LOCAL, False, LocalDraftServing),  # the demo: the pipeline runs the unit's ExecStart
        (LOCAL, True, ProductionDraftServing),  # this machine's systemd runs the unit
        (ServerSettings(host="gpu-box"), False, ProductionDraftServing),  # over SSH
    ],
)
def test_the_backend_decides_how_the_draft_is_served(monkeypatch, tmp_path, server, systemd, expected):
    monkeypatch.setattr(backend, "_has_systemd", lambda: systemd)
    serving = draft_serving.draft_serving(server, ValidateSettings(), {}, tmp_path)
    assert type(serving) is expected and serving.server is server


def test_no_host_record_to_recover_where_the_pipeline_runs_the_unit(monkeypatch):
    from eagle3_pipeline.server import host_record, remote

    monkeypatch.setattr(backend, "_has_systemd", lambda: False)
    monkeypatch.setattr(remote, "open_host", lambda server: pytest.fail("no host to open"))
    assert host_record.recover_leftover_check(LOCAL) == []


@pytest.mark.parametrize("by_k_max", [0, 3])
def test_production_serves_the_run_in_its_check_unit_and_measures_no_other_k(monkeypatch, tmp_path, by_k_max):
    from eagle3_pipeline.validate import production_check

    seen: dict[str, Any] = {}

    def remote(server, validate, snapshot, **run):
        seen.update(run, snapshot=snapshot)
        return {"acceptance_length": 2.0}

    monkeypatch.setattr(production_check, "run_remote_serve_check", remote)
    run = _run(tmp_path)
    validate = ValidateSettings(by_k_max=by_k_max)
    snapshot = ServerSnapshot.from_json({"model": "/m", "served_model_name": "m"})
    serving = ProductionDraftServing(ServerSettings(host="gpu-box"), validate, snapshot)
    result = serving.serve_with_draft(run, lambda figures: figures | {"concluded": True})
    assert seen == {**run.measured(), "snapshot": snapshot}
    assert result["concluded"] and ("by_k" in result) == bool(by_k_max)
    if by_k_max:
        assert result["by_k"] == {"reason": ProductionDraftServing.BY_K_OFF}
        assert ProductionDraftServing.BY_K_OFF.startswith("not measured: a systemd unit would restart")
    untimed = ProductionDraftServing(ServerSettings(), ValidateSettings(speedup=False), {})
    assert untimed.time_without_draft(run, result) == {"speedup": None, "reason": SPEEDUP_OFF}


def test_a_local_check_starts_every_k_with_the_check_and_reports_the_curve_in_order(monkeypatch, tmp_path):
    from eagle3_pipeline.validate import local_vllm

    seen: dict[str, Any] = {}
    point = {"acceptance_length": 2.0, "drafts": 10, "answered": 2}

    def run_local_checks(server, validate, conclude, ask, by_k, speedup_levels, per_request_metrics, **run):
        seen.update(by_k=by_k, levels=speedup_levels, per_request=per_request_metrics, run=run)
        measured = {k: {"greedy": point, "sampled": point} for k in ("4", "1")}
        return conclude(dict(point, by_k=measured))

    monkeypatch.setattr(local_vllm, "run_local_checks", run_local_checks)
    run = _run(tmp_path)
    validate = ValidateSettings(num_speculative_tokens=2, by_k_max=4, speedup=False)
    serving = LocalDraftServing(LOCAL, validate, {"vllm_version": "0.32.0"})
    result = serving.serve_with_draft(run, lambda figures: figures | {"concluded": True})
    assert seen == {"by_k": [1, 3, 4], "levels": None, "per_request": True, "run": run.measured()}
    assert result["concluded"] and list(result["by_k"]) == ["1", "2", "4"]  # the check's own k from its run
    assert result["by_k"]["2"] == {"greedy": point, "sampled": point}
    assert serving.time_without_draft(run, result) == {"speedup": None, "reason": SPEEDUP_OFF}


class _Recorded(DraftServing):
    """A serving that records what serve_check asked of it."""

    calls: list[str] = []

    def serve_with_draft(self, run: ServeCheckRun, conclude) -> dict[str, Any]:
        self.calls.append("serve")
        figures = {"acceptance_length": 2.5, "drafts": 7, "answered": len(run.questions)}
        return conclude(figures | {"questions": len(run.questions), "concurrency": run.concurrency})

    def time_without_draft(self, run: ServeCheckRun, with_draft: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("time")
        return {"speedup": 1.5, "acceptance_length": with_draft["acceptance_length"]}


def test_the_rule_serves_and_times_through_the_backends_serving(monkeypatch, tmp_path):
    from eagle3_pipeline.validate import serve_check

    pl.DataFrame({"id": ["b", "a"], "system": [None, None], "question": ["?", "!"]}).write_parquet(
        tmp_path / "validation.parquet"
    )
    (tmp_path / "server.json").write_text(json.dumps({"model": "/m", "served_model_name": "demo"}))
    chosen: list[tuple] = []

    def choose(server, validate, snapshot, state_dir):
        chosen.append((snapshot.served_model_name, state_dir))
        return _Recorded(server, validate, snapshot)

    monkeypatch.setattr(serve_check, "draft_serving", choose)
    _Recorded.calls = []
    result = serve_check.serve_check(
        tmp_path / "ckpt", tmp_path / "validation.parquet", tmp_path / "server.json", LOCAL,
        GenerationSettings(concurrency=8), ValidateSettings(), str(tmp_path / "work"), tmp_path / "out.json",
    )  # fmt: skip
    assert chosen == [("demo", tmp_path / "work")] and _Recorded.calls == ["serve", "time"]
    assert result["question_ids"] == ["a", "b"] and result["concurrency"] == 2  # no more than questions
    assert result["speedup"] == {"speedup": 1.5, "acceptance_length": 2.5}
    assert json.loads((tmp_path / "out.json").read_text()) == json.loads(json.dumps(result))
