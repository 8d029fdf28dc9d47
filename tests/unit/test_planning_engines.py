"""planning.engines: the extraction engines' folders and the paths derived from them."""

from __future__ import annotations

from pathlib import Path

from eagle3_pipeline.planning.engines import EngineScopes


def test_one_engine_for_the_main_shards_without_windows():
    engines = EngineScopes("results/r", "results/r/work", "results/r/logs", windowed=False)
    assert engines.pattern == engines.root == engines.folder() == "results/r/work/hidden_states/engine"
    assert engines.folder("0", 1) == engines.root  # an epoch and window change nothing
    assert engines.roots == [engines.root, "results/r/work/baseline/hidden_states/engine"]
    assert engines.stats_roots == [
        "results/r/hidden_states/engine_stats",
        "results/r/baseline/hidden_states/engine_stats",
    ]
    baseline_log = "results/r/logs/extraction_engine/baseline/hidden_states/engine.log"
    assert engines.log(engines.baseline) == baseline_log
    assert engines.service(engines.root) == "results/r/work/hidden_states/engine/service.json"


def test_one_engine_per_epoch_and_plan_window_under_a_cap():
    engines = EngineScopes("results/r", "results/r/work", "results/r/logs", windowed=True)
    assert engines.pattern == "results/r/work/hidden_states/engine/epoch-{epoch}-window-{window}"
    where = engines.folder("1", 2)
    assert where == "results/r/work/hidden_states/engine/epoch-1-window-2"
    assert engines.scope(where) == "hidden_states/engine/epoch-1-window-2"
    assert engines.stats_dir(where) == "results/r/hidden_states/engine_stats/epoch-1-window-2"
    assert engines.log(where) == "results/r/logs/extraction_engine/hidden_states/engine/epoch-1-window-2.log"


def test_every_extraction_job_consumes_its_scopes_service_which_exists_when_planned(tmp_path):
    # Snakemake deletes a group's service output once the group is done; planning makes it again, so a
    # done shard's ancient input exists (no rerun) while one that runs still pulls its engine job in
    engines = EngineScopes(
        str(tmp_path / "r"), str(tmp_path / "r/work"), str(tmp_path / "r/logs"), windowed=True
    )
    where = engines.folder("0", 1)
    service = engines.planned_service(where)
    assert service == engines.service(where) and Path(service).read_text() == ""
    Path(service).write_text('{"pid": 1}')  # the engine job's record while it runs: left as it is
    before = Path(service).stat().st_mtime_ns
    assert engines.planned_service(where) == service
    assert Path(service).read_text() == '{"pid": 1}' and Path(service).stat().st_mtime_ns == before
