"""Generation against the real vLLM CPU server on the demo target: a shard end to end through the rule's
entry point (damaged rows, a too-long prompt, resume sends nothing), the server killed mid-shard and
restarted (nothing lost, nothing duplicated), an outage longer than server.start_timeout_s (the shard
job fails, no failed row, the rerun finishes), the preflight, and a server without a reasoning parser
(split from content). Kept small: 16 prompts, max_tokens 64, the CPU is shared with the server."""

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace

import polars as pl
import pytest
from support.generation_server import REPO, VllmProcess

from eagle3_pipeline.generate import generate_shard, run_generation
from eagle3_pipeline.generate.payload import Sampling
from eagle3_pipeline.generate.preflight import PreflightError, run_preflight
from eagle3_pipeline.prompts import normalise, prepare_prompts, write_prompt_shard
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import DatasetSettings, GenerationSettings, ServerSettings, as_params

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GENERATION = GenerationSettings(
    max_tokens=64,
    temperature=0.6,
    top_p=0.95,
    seed=0,
    concurrency=8,
    global_concurrency=8,
    retries=3,
    request_timeout_s=300,
)
# an unmanaged server without an API key, found through server.json
SERVER = ServerSettings(manage=False, unit="vllm-demo.service", api_key_env="NO_SUCH_KEY_VAR")


def sample_rows(n):
    """The first n rows of the demo sample with distinct questions (the sample repeats some)."""
    rows, seen = [], set()
    for line in (REPO / "config/demo/sample.jsonl").read_text().splitlines():
        row = json.loads(line)
        key = normalise(next(t["value"] for t in row["conversations"] if t["from"] == "human"))
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return rows[:n]


def make_prompts(tmp_path, rows, extra_lines=(), num_samples=16):
    path = tmp_path / "dataset.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(x + "\n" for x in extra_lines))
    shard = tmp_path / "prompts/shard-00000.parquet"
    dataset = DatasetSettings(
        str(path), num_samples=num_samples, shard_size=num_samples, seed=0, turns="first"
    )
    selection = tmp_path / "prompts/selection.parquet"
    prepare_prompts(dataset, "none", num_samples, str(selection), str(tmp_path / "prompts/skipped.parquet"))
    write_prompt_shard(str(selection), 0, num_samples, str(shard))
    return shard


def write_server_json(tmp_path, server):
    path = tmp_path / "server.json"
    path.write_text(
        json.dumps(
            {
                "base_url": server.base_url,
                "served_model_name": server.served_model_name,
                "reasoning_parser": server.reasoning_parser,
                "identity": "test-identity",
            }
        )
    )
    return path


def journal_ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_shard_end_to_end_with_damaged_rows_and_a_too_long_prompt(vllm_server, tmp_path):
    too_long = {"conversations": [{"from": "human", "value": "count " * 700}], "source": "long"}
    damaged = ['{"conversations": [{"from": "human", "value": 7}]}', "{broken json"]
    shard = make_prompts(tmp_path, [*sample_rows(14), too_long], damaged)
    skipped_rows = pl.read_parquet(tmp_path / "prompts/skipped.parquet")
    assert skipped_rows.height == 2
    args = dict(
        prompts_path=str(shard),
        output_path=str(tmp_path / "generations/shard-00000.parquet"),
        server_json_path=str(write_server_json(tmp_path, vllm_server)),
        server=replace(SERVER, start_timeout_s=600),
        generation=GENERATION,
        journal_path=str(tmp_path / "work/shard-00000.jsonl"),
        state_dir=str(tmp_path / "work/server"),
        shard=0,
    )
    generate_shard(**args)
    out = pl.read_parquet(args["output_path"])
    assert out.height == 15 and out["id"].to_list() == pl.read_parquet(shard)["id"].to_list()
    long_row = out.filter(pl.col("source") == "long").row(0, named=True)
    assert long_row["status"] == "skipped" and "context length" in long_row["reason"]
    ok = out.filter(pl.col("status") == "ok")
    assert ok.height == 14 and ok["server_identity"].unique().to_list() == ["test-identity"]
    for row in ok.iter_rows(named=True):
        assert row["finish_reason"] in ("stop", "length")
        assert len(row["completion_token_ids"]) == row["completion_tokens"] <= 64
        assert len(row["prompt_token_ids"]) == row["prompt_tokens"] > 0
        assert row["reasoning"] is not None  # the kimi_k2 parser starts in the thinking block
    # a second run sends nothing: every answer comes from the journal
    lines = journal_ids(tmp_path / "work/shard-00000.jsonl")
    generate_shard(**args)
    assert journal_ids(tmp_path / "work/shard-00000.jsonl") == lines
    assert pl.read_parquet(args["output_path"]).equals(out)


def test_server_killed_mid_shard_and_restarted(vllm_server, tmp_path):
    shard = make_prompts(tmp_path, sample_rows(16))
    frame = pl.read_parquet(shard)
    journal = tmp_path / "work/shard-00000.jsonl"
    outcome = {}

    def generate():
        outcome["out"] = run_generation(
            frame,
            vllm_server.base_url,
            Sampling(vllm_server.served_model_name, 64, 0.6, 0.95, 0),
            replace(GENERATION, concurrency=4),
            journal,
            "identity",
            health_timeout_s=600,
        )

    thread = threading.Thread(target=generate)
    thread.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (not journal.exists() or len(journal_ids(journal)) < 3):
        time.sleep(0.2)
    vllm_server.kill()
    finished_before_kill = len(journal_ids(journal))
    assert 3 <= finished_before_kill < 16, "the shard must be killed mid-way"
    time.sleep(3)
    vllm_server.start(wait=False)  # what systemd's Restart=on-failure does
    thread.join(900)
    assert not thread.is_alive()
    out = outcome["out"]
    assert out["status"].to_list() == ["ok"] * 16
    assert out["id"].to_list() == frame["id"].to_list()
    ids = journal_ids(journal)
    assert sorted(ids) == sorted(frame["id"].to_list())  # one journal line per prompt: none lost or repeated


def test_server_without_reasoning_parser_is_split_from_content(generation_target, tmp_path):
    from transformers import AutoTokenizer

    server = VllmProcess(generation_target, tmp_path, reasoning_parser=None).start()
    try:
        shard = make_prompts(tmp_path, sample_rows(8), num_samples=8)
        out = run_generation(
            pl.read_parquet(shard),
            server.base_url,
            Sampling(server.served_model_name, 128, 0.6, 0.95, 0),
            GENERATION,
            tmp_path / "j.jsonl",
            "identity",
        )
    finally:
        server.stop()
    tokenizer = AutoTokenizer.from_pretrained(generation_target)
    tags = set(tokenizer.convert_tokens_to_ids(["<think>", "</think>"]))
    close = tokenizer.convert_tokens_to_ids("</think>")
    assert out["status"].to_list() == ["ok"] * 8
    for row in out.iter_rows(named=True):
        # split at the first </think>: the tag is in neither part; a sampled reply that writes the tag
        # again keeps the later ones in its answer, as the model wrote them
        closes = row["completion_token_ids"].count(close)
        assert "</think>" not in (row["reasoning"] or "")
        assert (row["content"] or "").count("</think>") == max(closes - 1, 0), row
        assert (row["reasoning"] is not None) == bool(tags & set(row["completion_token_ids"]))


SHARD_JOB = """
import json, logging, sys
from eagle3_pipeline.generate import generate_shard
from eagle3_pipeline.settings import GenerationSettings, ServerSettings, section
logging.basicConfig(level=logging.INFO)
a = json.loads(sys.argv[1])
server, generation = section(ServerSettings, a.pop("server")), a.pop("generation")
generate_shard(**a, server=server, generation=section(GenerationSettings, generation))
"""


def test_an_outage_longer_than_the_start_timeout_fails_the_shard_job_and_the_rerun_finishes(
    vllm_server, tmp_path
):
    shard = make_prompts(tmp_path, sample_rows(16))
    journal = tmp_path / "work/shard-00000.jsonl"
    output = tmp_path / "generations/shard-00000.parquet"
    args = dict(
        prompts_path=str(shard),
        output_path=str(output),
        server_json_path=str(write_server_json(tmp_path, vllm_server)),
        server=as_params(replace(SERVER, start_timeout_s=5)),  # as JSON: the job builds the sections
        generation=as_params(replace(GENERATION, concurrency=2)),
        journal_path=str(journal),
        state_dir=str(tmp_path / "work/server"),
        shard=0,
    )
    job = subprocess.Popen(
        [sys.executable, "-c", SHARD_JOB, json.dumps(args)], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (not journal.exists() or len(journal_ids(journal)) < 2):
        time.sleep(0.2)
    vllm_server.kill()  # and it stays down past server.start_timeout_s
    try:
        code = job.wait(300)
        stderr = job.stderr.read()
    finally:
        vllm_server.start()
    assert code != 0, "an outage must fail the shard job"
    assert (
        "not healthy within server.start_timeout_s = 5 s" in stderr
        and "a rerun sends only the rest" in stderr
    )
    assert not output.exists()
    before = [json.loads(line) for line in journal.read_text().splitlines()]
    assert 2 <= len(before) < 16 and {line["result"]["status"] for line in before} == {"ok"}  # no failed row
    job = subprocess.run(
        [sys.executable, "-c", SHARD_JOB, json.dumps(args)], capture_output=True, text=True, timeout=900
    )
    assert job.returncode == 0, job.stderr[-3000:]
    out = pl.read_parquet(output)
    assert out["status"].to_list() == ["ok"] * 16
    ids = journal_ids(journal)
    assert sorted(ids) == sorted(out["id"].to_list())  # every prompt finished once: none twice
    assert ids[: len(before)] == [line["id"] for line in before]  # the rerun kept what was done


def test_preflight_against_the_real_server(vllm_server, tmp_path):
    too_long = {"conversations": [{"from": "human", "value": "count " * 700}], "source": "long"}
    make_prompts(tmp_path, [*sample_rows(7), too_long], num_samples=8)
    selection = tmp_path / "prompts/selection.parquet"
    sampling = Sampling(vllm_server.served_model_name, 64, 0.6, 0.95, None)
    server_json = ServerSnapshot.from_json({"reasoning_parser": "kimi_k2", "max_model_len": 512})
    result = run_preflight(vllm_server.base_url, sampling, server_json, selection)
    assert result["token_ids"] is True and result["reasoning"] == "returned"
    assert result["max_model_len"] == vllm_server.max_model_len
    assert result["fit"] == {"prompts": 8, "counted": 8, "over_max_model_len": 1, "at_least": False}
    with pytest.raises(PreflightError, match="leaves no room for a prompt"):
        run_preflight(vllm_server.base_url, Sampling(sampling.model, 512), server_json, selection)
    with pytest.raises(PreflightError, match=r"does not serve 'nope' \(it serves \['eagle3-demo-target'\]\)"):
        run_preflight(vllm_server.base_url, Sampling("nope", 64), server_json, selection)
