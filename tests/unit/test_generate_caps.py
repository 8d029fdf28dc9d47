"""The effective cap on a server's requests in flight (generate/caps.py), against the four caps it joins."""

from eagle3_pipeline.generate.caps import requests_in_flight, shard_jobs_at_once
from eagle3_pipeline.settings import GenerationSettings, ServerSettings


def test_the_schema_defaults_cap_one_local_job_at_its_concurrency():
    generation, server = GenerationSettings(), ServerSettings()
    jobs = shard_jobs_at_once(server.max_shard_jobs, scheduler_jobs=1, shards=4)
    assert jobs == 1
    assert requests_in_flight(generation.concurrency, generation.global_concurrency, jobs) == 64


def test_each_layer_can_be_the_binding_one():
    assert shard_jobs_at_once(None, scheduler_jobs=8, shards=3) == 3  # fewer shards than job slots
    assert shard_jobs_at_once(2, scheduler_jobs=8, shards=100) == 2  # server.max_shard_jobs
    assert shard_jobs_at_once(None, scheduler_jobs=8, shards=100) == 8  # --cores / --jobs
    assert requests_in_flight(16, 64, shard_jobs=2) == 32  # generation.concurrency per job
    assert requests_in_flight(64, 64, shard_jobs=4) == 64  # global_concurrency on one node
    assert requests_in_flight(64, 64, shard_jobs=4, nodes=4) == 256  # per node only: nodes x G
