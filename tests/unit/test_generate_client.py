"""Generation client and shard runner against a scripted HTTP endpoint: payload, parsing, retries,
/health waits, context-length skips, resume, a kill mid-shard, and the global cap across processes."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import polars as pl
import pytest

from eagle3_pipeline.generate.journal import Journal
from eagle3_pipeline.generate.payload import Sampling
from eagle3_pipeline.generate.reply import parse_completion, split_thinking
from eagle3_pipeline.generate.shard import OUTPUT_SCHEMA, run_generation
from eagle3_pipeline.prompts import PROMPT_SCHEMA
from eagle3_pipeline.settings import GenerationSettings, as_params

GEN = GenerationSettings(concurrency=4, global_concurrency=64, retries=5, request_timeout_s=10)


def prompts(n, system=None, prefix="q"):
    return pl.DataFrame(
        {
            "id": [f"id{i:04d}" for i in range(n)],
            "source": ["s"] * n,
            "row": list(range(n)),
            "turn": [0] * n,
            "system": [system] * n,
            "question": [f"{prefix}{i}" for i in range(n)],
            "original_answer": ["a"] * n,
        },
        schema=PROMPT_SCHEMA,
    )


def sampling(max_tokens=64, **kw):
    return Sampling("demo", max_tokens, 0.6, 0.95, 0, kw)


def generate(endpoint, frame, tmp_path, gen=GEN, **kw):
    kw.setdefault("sampling", sampling())
    return run_generation(
        frame,
        endpoint.base_url,
        generation=gen,
        journal_path=tmp_path / "j.jsonl",
        identity="ident",
        shard=3,
        health_timeout_s=30,
        **kw,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>r</think>c", ("r", "c")),
        ("r</think>c", ("r", "c")),
        ("<think>cut off", ("cut off", "")),
        ("plain", (None, "plain")),
        (None, (None, None)),
    ],
)
def test_split_thinking(text, expected):
    assert split_thinking(text) == expected


def test_reasoning_content_fallback():
    data = {
        "choices": [{"message": {"content": "c", "reasoning_content": "r"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5},
    }
    parsed = parse_completion(data)
    assert (parsed["reasoning"], parsed["content"], parsed["completion_tokens"]) == ("r", "c", 5)


def test_shard_end_to_end_payload_and_schema(scripted_endpoint, tmp_path):
    out = generate(scripted_endpoint, prompts(10, system="sys"), tmp_path, sampling=sampling(thinking=True))
    assert out.schema == pl.Schema(OUTPUT_SCHEMA)
    assert out["status"].to_list() == ["ok"] * 10 and out["id"].to_list() == [f"id{i:04d}" for i in range(10)]
    row = out.row(0, named=True)
    assert row["reasoning"] == "thinking about q0" and row["content"] == "answer to q0"
    assert row["completion_token_ids"] == list(range(2, 10)) and row["prompt_tokens"] == 4
    assert (row["shard"], row["max_tokens"], row["server_identity"]) == (3, 64, "ident")
    body = next(b for b in scripted_endpoint.bodies if b["messages"][-1]["content"] == "q0")
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    assert body["return_token_ids"] is True and body["chat_template_kwargs"] == {"thinking": True}
    assert body["seed"] == row["seed"] and body["max_tokens"] == 64 and "include_reasoning" not in body


def test_retries_on_5xx_429_and_dropped_connections(scripted_endpoint, tmp_path):
    scripted_endpoint.failures = [503, 429, 0, 500, 408, 502]
    gen = replace(GEN, retries=6)
    out = run_generation(
        prompts(4),
        scripted_endpoint.base_url,
        sampling(),
        gen,
        tmp_path / "j.jsonl",
        identity="i",
        health_timeout_s=30,
    )
    assert out["status"].to_list() == ["ok"] * 4
    assert sum(scripted_endpoint.requests.values()) == 4 + 6


def test_too_long_prompt_is_skipped_not_retried(scripted_endpoint, tmp_path):
    frame = prompts(3).with_columns(question=pl.Series(["q0", "TOO LONG q1", "q2"]))
    out = generate(scripted_endpoint, frame, tmp_path)
    assert out["status"].to_list() == ["ok", "skipped", "ok"]
    assert "maximum context length" in out["reason"][1]
    assert scripted_endpoint.requests["TOO LONG q1"] == 1


def test_server_without_reasoning_parser_is_split(scripted_endpoint, tmp_path):
    scripted_endpoint.reasoning_parser = False
    out = generate(scripted_endpoint, prompts(2), tmp_path)
    assert out["reasoning"].to_list() == ["thinking about q0", "thinking about q1"]
    assert out["content"].to_list() == ["answer to q0", "answer to q1"]


def test_restarting_server_is_waited_for_on_health(scripted_endpoint, tmp_path):
    scripted_endpoint.healthy = False
    scripted_endpoint.failures = [503] * 3
    threading.Timer(2.0, lambda: setattr(scripted_endpoint, "healthy", True)).start()
    out = generate(scripted_endpoint, prompts(6), tmp_path, gen=replace(GEN, retries=1))
    assert out["status"].to_list() == ["ok"] * 6  # retries=1 would not survive 3 x 503 without the wait


def test_dead_managed_server_is_started_again(scripted_endpoint, tmp_path, monkeypatch):
    import eagle3_pipeline.generate.client as client_module

    monkeypatch.setattr(client_module, "REVIVE_AFTER_S", 0.5)
    scripted_endpoint.healthy = False
    scripted_endpoint.failures = [503] * 2
    revived = []

    def revive() -> None:  # what lifecycle.ensure_running does for a managed server: start it
        revived.append(True)
        scripted_endpoint.healthy = True

    frame = run_generation(
        prompts(4),
        scripted_endpoint.base_url,
        sampling(),
        replace(GEN, retries=1),
        tmp_path / "j.jsonl",
        identity="i",
        health_timeout_s=60,
        revive=revive,
    )
    assert revived == [True]
    assert frame["status"].to_list() == ["ok"] * 4


def test_finished_shard_never_starts_the_server(scripted_endpoint, tmp_path):
    generate(scripted_endpoint, prompts(3), tmp_path)
    started = []

    def start_server() -> str:  # lifecycle.ensure_running in the rule: minutes of model load on a GPU box
        started.append(True)
        return scripted_endpoint.base_url

    again = run_generation(prompts(3), start_server, sampling(), GEN, tmp_path / "j.jsonl", identity="ident")
    assert started == []
    assert again["status"].to_list() == ["ok"] * 3
    run_generation(prompts(4), start_server, sampling(), GEN, tmp_path / "j.jsonl", identity="ident")
    assert started == [True]  # one new question: now the server is needed


def test_resume_sends_nothing_twice_and_max_tokens_change_resends(scripted_endpoint, tmp_path):
    generate(scripted_endpoint, prompts(5), tmp_path)
    first = generate(scripted_endpoint, prompts(5), tmp_path)
    assert sum(scripted_endpoint.requests.values()) == 5
    changed = generate(scripted_endpoint, prompts(5), tmp_path, sampling=sampling(max_tokens=32))
    assert sum(scripted_endpoint.requests.values()) == 10
    assert first["max_tokens"].to_list() == [64] * 5 and changed["max_tokens"].to_list() == [32] * 5


def test_all_failed_raises_and_keeps_the_journal(scripted_endpoint, tmp_path):
    scripted_endpoint.failures = [404] * 3
    with pytest.raises(RuntimeError, match="all 3 requests failed"):
        generate(scripted_endpoint, prompts(3), tmp_path)
    assert len((tmp_path / "j.jsonl").read_text().splitlines()) == 3
    assert generate(scripted_endpoint, prompts(3), tmp_path)["status"].to_list() == ["ok"] * 3


CHILD = """
import json, sys, logging
import polars as pl
from eagle3_pipeline.generate.payload import Sampling
from eagle3_pipeline.generate.shard import run_generation
from eagle3_pipeline.settings import GenerationSettings, section
a = json.loads(sys.argv[1])
logging.basicConfig(level=logging.INFO)
frame = pl.read_parquet(a["prompts"])
generation = section(GenerationSettings, a["gen"])
run_generation(frame, a["url"], Sampling("demo", 64, 0.6, 0.95, 0), generation, a["journal"], "i",
               health_timeout_s=30, slots_dir=a["slots"]).write_parquet(a["out"])
"""


def child(endpoint, tmp_path, name, frame, gen):
    frame.write_parquet(tmp_path / f"{name}.parquet")
    args = {
        "prompts": str(tmp_path / f"{name}.parquet"),
        "url": endpoint.base_url,
        "gen": as_params(gen),
        "journal": str(tmp_path / f"{name}.jsonl"),
        "slots": str(tmp_path / "slots"),
        "out": str(tmp_path / f"{name}-out.parquet"),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)], stderr=subprocess.PIPE, text=True
    )


def test_global_cap_holds_across_parallel_shard_jobs(scripted_endpoint, tmp_path):
    scripted_endpoint.delay_s = 0.05
    gen = replace(GEN, concurrency=8, global_concurrency=5)
    jobs = [child(scripted_endpoint, tmp_path, f"s{k}", prompts(60, prefix=f"s{k}-"), gen) for k in range(2)]
    for job in jobs:
        assert job.wait(120) == 0, job.stderr.read()
    assert scripted_endpoint.max_in_flight == 5
    for k in range(2):
        assert pl.read_parquet(tmp_path / f"s{k}-out.parquet")["status"].to_list() == ["ok"] * 60


def test_killed_mid_shard_resumes_without_loss_or_duplicate(scripted_endpoint, tmp_path):
    scripted_endpoint.delay_s = 0.05
    frame = prompts(80)
    job = child(scripted_endpoint, tmp_path, "k", frame, GEN)
    journal = tmp_path / "k.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not journal.exists() or journal.read_text().count("\n") < 20):
        time.sleep(0.02)
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    done_before = {json.loads(line)["id"] for line in journal.read_text().splitlines()}
    assert 20 <= len(done_before) < 80
    sent_before = sum(scripted_endpoint.requests.values())
    job = child(scripted_endpoint, tmp_path, "k", frame, GEN)
    assert job.wait(120) == 0, job.stderr.read()
    out = pl.read_parquet(tmp_path / "k-out.parquet")
    assert out["id"].to_list() == frame["id"].to_list() and out["status"].to_list() == ["ok"] * 80
    resent = sum(scripted_endpoint.requests.values()) - sent_before
    assert resent == 80 - len(done_before)  # nothing finished is sent again
    with Journal(journal, "unused") as reopened:
        assert reopened.stale == 80  # exactly one line per prompt: no duplicate


def test_an_empty_shard_sends_nothing_and_writes_an_empty_table(tmp_path):
    out = run_generation(
        prompts(0), "http://127.0.0.1:9", sampling(), GEN, tmp_path / "j.jsonl", identity="i"
    )
    assert out.height == 0 and out.schema == pl.Schema(OUTPUT_SCHEMA)


def test_a_job_started_later_gets_its_share_of_the_global_cap(scripted_endpoint, tmp_path):
    scripted_endpoint.delay_s = 0.1
    gen = replace(GEN, concurrency=8, global_concurrency=8)
    first = child(scripted_endpoint, tmp_path, "a", prompts(600, prefix="a-"), gen)
    while sum(scripted_endpoint.requests.values()) < 24:
        time.sleep(0.02)
    second = child(scripted_endpoint, tmp_path, "b", prompts(40, prefix="b-"), gen)
    for job in (first, second):
        assert job.wait(120) == 0, job.stderr.read()
    order = [body["messages"][-1]["content"][0] for body in scripted_endpoint.bodies]
    last_b = max(i for i, who in enumerate(order) if who == "b")
    # without sharing, "a" would hold all 8 slots until its queue is empty and "b" would come last
    assert order[last_b + 1 :].count("a") > 40


def journal_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_outage_longer_than_the_start_timeout_fails_the_job_and_the_rerun_resumes(
    scripted_endpoint, tmp_path
):
    from eagle3_pipeline.generate.client import ServerUnavailable

    generate(scripted_endpoint, prompts(6), tmp_path)  # six finished before the outage
    scripted_endpoint.healthy = False
    scripted_endpoint.failures = [503] * 100
    with pytest.raises(ServerUnavailable, match=r"not healthy within server.start_timeout_s = 2 s"):
        run_generation(
            prompts(12),
            scripted_endpoint.base_url,
            sampling(),
            GEN,
            tmp_path / "j.jsonl",
            "ident",
            health_timeout_s=2,
        )
    assert [line["result"]["status"] for line in journal_lines(tmp_path / "j.jsonl")] == ["ok"] * 6
    scripted_endpoint.healthy, scripted_endpoint.failures = True, []
    out = generate(scripted_endpoint, prompts(12), tmp_path)
    assert out["status"].to_list() == ["ok"] * 12
    ids = [line["id"] for line in journal_lines(tmp_path / "j.jsonl")]
    assert sorted(ids) == sorted(out["id"].to_list())  # each prompt finished exactly once


def test_transient_errors_past_the_retries_fail_the_job_not_the_prompt(scripted_endpoint, tmp_path):
    from eagle3_pipeline.generate.client import ServerUnavailable

    scripted_endpoint.failures = [502] * 50
    with pytest.raises(ServerUnavailable, match="HTTP 502"):
        generate(scripted_endpoint, prompts(2), tmp_path, gen=replace(GEN, retries=1))
    assert not (tmp_path / "j.jsonl").read_text()


def test_a_500_on_a_healthy_server_is_that_prompts_failure(scripted_endpoint, tmp_path):
    scripted_endpoint.failures = [500, 500]
    out = generate(scripted_endpoint, prompts(2), tmp_path, gen=replace(GEN, retries=1, concurrency=1))
    assert out["status"].to_list() == ["failed", "ok"]
    assert "while /health answers 200" in out["reason"][0]


def test_a_request_timeout_is_retried_without_suspecting_the_server(scripted_endpoint, tmp_path):
    scripted_endpoint.delays = [3.0]
    out = generate(scripted_endpoint, prompts(1), tmp_path, gen=replace(GEN, request_timeout_s=0.5))
    assert out["status"].to_list() == ["ok"]
    assert scripted_endpoint.requests["q0"] == 2
    assert scripted_endpoint.health_checks == 0  # a slow answer is not a dead server


def test_request_timeouts_past_the_retries_fail_the_job_with_a_hint(scripted_endpoint, tmp_path):
    from eagle3_pipeline.generate.client import ServerUnavailable

    scripted_endpoint.delays = [3.0] * 3
    with pytest.raises(ServerUnavailable, match="raise generation.request_timeout_s"):
        generate(scripted_endpoint, prompts(1), tmp_path, gen=replace(GEN, request_timeout_s=0.3, retries=1))


def test_a_malformed_reply_is_retried_then_failed_for_that_prompt_only(scripted_endpoint, tmp_path):
    scripted_endpoint.malformed = [b"{not json", b'{"object": "error"}']
    out = generate(scripted_endpoint, prompts(1), tmp_path, gen=replace(GEN, retries=2))
    assert out["status"].to_list() == ["ok"]  # two malformed replies, then a good one
    scripted_endpoint.malformed = [b'{"choices": []}'] * 3
    out = generate(
        scripted_endpoint, prompts(3, prefix="m"), tmp_path / "x", gen=replace(GEN, retries=2, concurrency=1)
    )
    assert out["status"].to_list() == ["failed", "ok", "ok"]
    assert "3 attempts" in out["reason"][0] and "without choices" in out["reason"][0]


def test_https_with_a_ca_bundle_and_an_untrusted_certificate_refused(tmp_path):
    import ssl

    from support.http_endpoint import ScriptedEndpoint
    from support.tls import self_signed

    from eagle3_pipeline.generate.client import ServerUnavailable

    cert, key = self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    endpoint = ScriptedEndpoint(tls=tls).start()
    try:
        assert endpoint.base_url.startswith("https://")
        out = generate(endpoint, prompts(3), tmp_path, ca_bundle=str(cert))
        assert out["status"].to_list() == ["ok"] * 3
        # refused at once with the fix named, not waited out as an outage (the health timeout is 30 s)
        with pytest.raises(ServerUnavailable, match="server.ca_bundle"):
            generate(endpoint, prompts(1, prefix="u"), tmp_path / "untrusted")
    finally:
        endpoint.stop()


def conversations(n, turns=3):
    """n conversations of `turns` questions each (dataset row r, turns 0, 2, 4...)."""
    return pl.DataFrame(
        {
            "id": [f"c{r}t{t}" for r in range(n) for t in range(turns)],
            "source": ["s"] * (n * turns),
            "row": [r for r in range(n) for _ in range(turns)],
            "turn": [2 * t for _ in range(n) for t in range(turns)],
            "system": ["sys"] * (n * turns),
            "question": [f"c{r} q{t}" for r in range(n) for t in range(turns)],
            "original_answer": ["dataset answer"] * (n * turns),
        },
        schema=PROMPT_SCHEMA,
    )


def test_history_own_sends_later_turns_after_the_targets_own_answers(scripted_endpoint, tmp_path):
    scripted_endpoint.delay_s = 0.2
    frame = conversations(4).with_columns(
        question=pl.when(pl.col("id") == "c3t1").then(pl.lit("c3 TOO LONG")).otherwise("question")
    )
    out = generate(scripted_endpoint, frame, tmp_path, gen=replace(GEN, history="own", concurrency=8))
    assert scripted_endpoint.max_in_flight == 4  # conversations side by side, turns in sequence
    body = next(b for b in scripted_endpoint.bodies if b["messages"][-1]["content"] == "c1 q2")
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "c1 q0"},
        {"role": "assistant", "content": "answer to c1 q0"},  # the target's own, not the dataset's
        {"role": "user", "content": "c1 q1"},
        {"role": "assistant", "content": "answer to c1 q1"},
        {"role": "user", "content": "c1 q2"},
    ]
    by_id = dict(zip(out["id"], out["status"], strict=True))
    assert by_id["c3t1"] == "skipped" and by_id["c3t2"] == "skipped"  # no answer to follow
    assert "c3 q2" not in scripted_endpoint.requests
    assert [by_id[f"c{r}t{t}"] for r in range(3) for t in range(3)] == ["ok"] * 9
    again = generate(scripted_endpoint, frame, tmp_path, gen=replace(GEN, history="own"))
    assert again.equals(out) and sum(scripted_endpoint.requests.values()) == 11  # resumed from the journal
