"""An engine scope's allocation on a cluster (hidden_states/allocation.py): the engine's memory and CPUs
with its clients' packing, each client's floor, the time limit from the plan, the GPUs in the profile's
form (--gpus or --gres), read from the profile as Snakemake parses it. The sbatch lines themselves are
rendered by the SLURM plugin in tests/workflow/test_profiles.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from snakemake.resources import Resources
from support.traces import checked_traces

from eagle3_pipeline.config import check_config, shard_ids
from eagle3_pipeline.hidden_states import allocation
from eagle3_pipeline.launch import job_gpus
from eagle3_pipeline.settings import Settings, build_settings

REPO = Path(__file__).resolve().parents[2]
KIMI = REPO / "config" / "examples" / "kimi-k2.5-8gpu.yaml"
PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
ENGINE = PROFILE["set-resources"]["serve_extraction_engine"]
CLIENT = PROFILE["set-resources"]["extract_hidden_states"]
H = 7168


def _kimi(**hidden_states: object) -> Settings:
    raw = yaml.safe_load(KIMI.read_text())
    raw["hidden_states"] = {**raw["hidden_states"], **hidden_states}
    return build_settings(check_config(raw, REPO / "config" / "schema.yaml"))


def test_a_packing_client_holds_a_sample_s_rows_and_a_part():
    # 10,240 tokens x 3 auxiliary layers x 7,168 x 2 B, and a part of 32,768 tokens x 57,353 B
    assert allocation.packing_bytes(_kimi(), H) == 10240 * 3 * H * 2 + 32768 * 57353 == 2_319_745_024


def test_the_engine_asks_for_its_own_and_its_packing_clients_whatever_the_scope_size():
    settings = _kimi()
    # 1,000,000 MiB and 64 CPUs of its own; 4 pack slots of 2,213 MiB and one CPU each
    alloc = allocation.allocation(settings, 10**6, H, ENGINE, CLIENT)
    assert (alloc.mem_mb, alloc.cpus, alloc.client_mem_mb, alloc.gpus) == (1_008_852, 68, 512, 8)
    # Snakemake adds each client's floor: a window of 34 shards, a shard forced again alone
    assert alloc.group_mem_mb(34) == 1_008_852 + 34 * 512 and alloc.group_mem_mb(1) == 1_009_364
    # the clients' slots hold no memory of their own: max_clients changes nothing, pack_slots does
    assert allocation.allocation(_kimi(vllm={"max_clients": 8}), 1, H, ENGINE, CLIENT) == alloc.__class__(
        8, 1_008_852, 68, allocation.time_limit(settings, 1), 512
    )
    two = allocation.allocation(_kimi(pack_slots=2), 1, H, ENGINE, CLIENT)
    assert (two.mem_mb, two.cpus) == (1_000_000 + 2 * 2213, 66)


def test_the_profile_s_own_totals_win_and_none_sizes_nothing():
    settings = _kimi()
    given = {**ENGINE, "mem_mb": 900000, "cpus_per_task": 32, "runtime": 720}
    alloc = allocation.allocation(settings, 10**9, H, given, CLIENT)
    assert (alloc.mem_mb, alloc.cpus, alloc.runtime) == (900000, 32, 720)
    bare = allocation.allocation(settings, 10**9, None, {"gpu": 8}, {})  # a local profile: no sizes
    assert (bare.mem_mb, bare.cpus, bare.client_mem_mb) == (None, None, None)
    with pytest.raises(allocation.AllocationError, match="hidden size"):
        allocation.engine_mem_mb(ENGINE, settings, None, "serve_extraction_engine")
    with pytest.raises(allocation.AllocationError, match="engine_cpus: '8 \\* 8' must be a whole number"):
        allocation.engine_cpus({"engine_cpus": "8 * 8"}, settings, "serve_extraction_engine")


def test_the_time_limit_is_the_scope_s_tokens_at_the_expected_throughput_and_one_start():
    settings = _kimi()
    window = 34 * 200 * 10240  # a window of the example at the bound
    # (600 s + 69,632,000 / 10,000 tokens/s) x 1.5 = 11,344.8 s: 190 minutes
    assert allocation.time_limit(settings, window) == 190
    faster = _kimi(vllm={"expected_tokens_per_s": 20000, "expected_start_s": 300})
    assert allocation.time_limit(faster, window) == 95  # (300 + 3,481.6) x 1.5 / 60
    assert allocation.time_limit(settings, window, {"runtime": 720}) == 720


def test_gpus_are_asked_for_in_the_profile_s_form():
    assert allocation.gpu_form({}) == "gpus" and allocation.gpu_form({"gpus_as": "gres"}) == "gres"
    with pytest.raises(allocation.AllocationError, match="gpus_as"):
        allocation.gpu_form({"gpus_as": "gpu"})
    assert allocation.gpu_request("gpus", 8) == {"gpu": 8}
    assert allocation.gpu_request("gres", 8) == {"gres": "gpu:8"}
    assert allocation.gpu_request("gres", 0) == {}
    # the count a job runs with (its launcher's processes), in either form
    assert job_gpus({"gpu": 8}) == 8 and job_gpus({"gres": "gpu:8"}) == 8
    assert job_gpus({"gres": "gpu:h100:4"}) == 4 and job_gpus({"gres": "shard:2"}) == 0 and job_gpus({}) == 0


def test_the_profile_s_values_read_as_snakemake_parses_them():
    # set-resources and default-resources as the CLI hands them over: a number, a bare word, a quoted
    # string, a gres (Snakemake keeps strings unevaluated until a job evaluates them)
    parsed = Resources.parse(
        ["engine_mem_mb=1000000", "gpus_as=gres", "slurm_partition='gpu'", "gres=gpu:8"],
        allow_expressions=True,
    )
    plain = allocation.plain_resources(parsed)
    assert plain == {"engine_mem_mb": 1000000, "gpus_as": "gres", "slurm_partition": "gpu", "gres": "gpu:8"}
    assert allocation.gpu_form(plain) == "gres" and allocation.gpu_count(plain) == 8


def test_a_shard_is_planned_from_its_checked_traces_else_at_its_bound(tmp_path):
    settings = _kimi(max_disk_gb=None)
    shards = shard_ids(settings.dataset.num_samples, settings.dataset.shard_size)
    bound = allocation.shard_tokens(settings, shards, H, tmp_path)
    assert set(bound.values()) == {200 * 10240} and len(bound) == 100
    made = {"hidden_size": H, "dtype": "bfloat16", "max_seq_len": 10240, "overlong": "truncate"}
    checked_traces(tmp_path, 3, {"total_bytes": 200 * 3512 * 57353, **made})
    tokens = allocation.shard_tokens(settings, shards, H, tmp_path)
    assert [tokens[k] for k in shards[:4]] == [200 * 3512] * 3 + [200 * 10240]
    # a record made for another hidden size, or no hidden size known: the bound
    assert allocation.shard_tokens(settings, shards, 4096, tmp_path) == bound
    assert allocation.shard_tokens(settings, shards, None, tmp_path) == bound
