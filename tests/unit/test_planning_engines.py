"""planning.engines: the extraction engines' folders and the paths derived from them."""

from __future__ import annotations

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


def test_a_shards_files_decide_whether_it_needs_its_engine():
    engines = EngineScopes("results/r", "results/r/work", "results/r/logs", windowed=True)
    traces, outputs = engines.shard_files("results/r/hidden_states/epoch-0", "00003")
    assert traces == [
        "results/r/traces/shards/train/shard-00003.parquet",
        "results/r/traces/shards/validation/shard-00003.parquet",
    ]
    assert outputs == [
        "results/r/hidden_states/epoch-0/train/shard-00003.safetensors",
        "results/r/hidden_states/epoch-0/train/shard-00003.json",
        "results/r/hidden_states/epoch-0/validation/shard-00003.safetensors",
        "results/r/hidden_states/epoch-0/validation/shard-00003.json",
    ]
    traces, outputs = engines.baseline_shard_files("00003")
    assert traces == ["results/r/baseline/traces/shards/train/shard-00003.parquet"]
    assert outputs == [
        "results/r/baseline/hidden_states/train/shard-00003.safetensors",
        "results/r/baseline/hidden_states/train/shard-00003.json",
    ]
