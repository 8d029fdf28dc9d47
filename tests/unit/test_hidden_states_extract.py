"""The per-shard job: contract of the written files, resume after an interruption, empty shards, and the
real `accelerate launch` command (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.hidden_states import trace_rows, write_traces
from transformers import AutoModelForCausalLM

from eagle3_pipeline.hidden_states import HiddenStateShard, capture, extract, packing, parts, plan, sequences
from eagle3_pipeline.hidden_states import transformers_extraction as backend
from eagle3_pipeline.hidden_states.job import ShardJob, rule_jobs, write_jobs
from eagle3_pipeline.settings import HiddenStatesSettings

REPO = Path(__file__).resolve().parents[2]
CONTRACT_KEYS = set(
    [
        "ids",
        "num_samples",
        "num_tokens",
        "num_loss_tokens",
        "hidden_size",
        "num_hidden_layers",
        "vocab_size",
        "aux_layers",
        "aux_layers_vllm",
        "final_state",
        "dtype",
        "target",
        "token_counts",
        "rebuilt_from_template",
        "overlong",
        "bytes_per_token",
        "floor_bytes_per_token",
    ]
)


@pytest.fixture
def traces(hs_tokenizer, tmp_path) -> Path:
    rows = trace_rows(hs_tokenizer, 7, shard=0) + trace_rows(hs_tokenizer, 2, shard=1, start=7)
    rows[3]["prompt_token_ids"] = rows[3]["completion_token_ids"] = None  # an older server: rebuilt
    return write_traces(tmp_path / "train.parquet", rows)


def settings(**kw) -> HiddenStatesSettings:
    return HiddenStatesSettings(
        **{"backend": "transformers", "batch_tokens": 100, "compute_dtype": "float32", **kw}
    )


HS = settings()


def job_for(traces: Path, target: Path, out: Path, shard: int = 0) -> ShardJob:
    out.mkdir(exist_ok=True)
    return ShardJob(
        traces=traces, shard=shard, target=target, work=out / "work",
        output=out / f"shard-{shard:05d}.safetensors", metadata=out / f"shard-{shard:05d}.json",
    )  # fmt: skip


def test_shard_follows_the_contract_and_matches_a_plain_forward(traces, hs_target, tmp_path):
    s = job_for(traces, hs_target, tmp_path / "out")
    meta = extract.extract_shards(HS, [s])[0]
    on_disk = json.loads(s.metadata.read_text())
    assert on_disk == meta and set(meta) >= CONTRACT_KEYS
    assert meta["ids"] == [f"id{i:04d}" for i in range(7)] and meta["rebuilt_from_template"] == 1
    assert meta["aux_layers"] == [1, 3, 4] and meta["aux_layers_vllm"] == [2, 4, 5]
    assert meta["final_state"] == "post_norm" and meta["dtype"] == "bfloat16"
    h = meta["hidden_size"]
    assert meta["floor_bytes_per_token"] == 4 * h * 2 <= meta["bytes_per_token"] < 4 * h * 2 + 64
    assert sum(meta["token_counts"].values()) == meta["num_loss_tokens"]
    assert not s.work.exists() and not list(s.output.parent.glob("*.tmp"))
    model = AutoModelForCausalLM.from_pretrained(str(hs_target), dtype=torch.float32).eval()
    counts: dict[str, int] = {}
    with HiddenStateShard(s.output) as shard:
        assert shard.metadata["aux_layers_vllm"] == [2, 4, 5]
        for sample in shard:
            ids = sample["input_ids"].long()
            with torch.inference_mode():
                hs = model(ids[None], output_hidden_states=True).hidden_states
            want_aux = torch.cat([hs[v][0] for v in meta["aux_layers_vllm"]], dim=-1)
            torch.testing.assert_close(sample["aux_hidden_states"].float(), want_aux, rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(sample["final_hidden_states"].float(), hs[-1][0], rtol=2e-2, atol=2e-2)
            for t in ids[sample["loss_mask"].bool()].tolist():
                counts[str(t)] = counts.get(str(t), 0) + 1
    assert counts == meta["token_counts"]


def test_resume_redoes_only_unfinished_batches(traces, hs_target, tmp_path, monkeypatch):
    reference = job_for(traces, hs_target, tmp_path / "ref")
    extract.extract_shards(HS, [reference])
    s = job_for(traces, hs_target, tmp_path / "out")
    real_run_batch, calls = backend.run_batch, []

    def dies_on_third(model, seqs, batch, layers, dtype):
        calls.append(batch)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return real_run_batch(model, seqs, batch, layers, dtype)

    monkeypatch.setattr(backend, "run_batch", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        extract.extract_shards(HS, [s])
    assert not s.output.exists() and len(list((s.work / "parts").glob("*.safetensors"))) == 2
    monkeypatch.setattr(backend, "run_batch", lambda *a: calls.append(a[2]) or real_run_batch(*a))
    extract.extract_shards(HS, [s])
    first, second = calls[:3], calls[3:]
    assert second[0] == first[2]  # the interrupted batch runs again, the two saved ones do not
    assert sorted(i for b in first[:2] + second for i in b) == list(range(7))
    with HiddenStateShard(s.output) as got, HiddenStateShard(reference.output) as want:
        for a, b in zip(got, want, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads(s.metadata.read_text())["ids"] == json.loads(reference.metadata.read_text())["ids"]


def test_parts_of_another_plan_are_not_reused(traces, hs_target, tmp_path, monkeypatch):
    s = job_for(traces, hs_target, tmp_path / "out")
    calls = []
    real = backend.run_batch
    monkeypatch.setattr(backend, "run_batch", lambda *a: calls.append(1) or real(*a))
    parts.prepare_work(s.work, "another plan")
    (s.work / "parts" / "batch-00000.safetensors").write_bytes(b"stale")
    extract.extract_shards(HS, [s])
    with HiddenStateShard(s.output) as shard:
        assert len(shard) == 7
        lengths = shard.offsets.diff().tolist()
    assert len(calls) == len(sequences.longest_first_batches(lengths, HS.batch_tokens))  # every batch ran


def test_empty_shard_is_valid(traces, hs_target, tmp_path):
    s = job_for(traces, hs_target, tmp_path / "out", shard=5)
    meta = extract.extract_shards(HS, [s])[0]
    assert meta["num_samples"] == meta["num_tokens"] == 0 and meta["bytes_per_token"] is None
    with HiddenStateShard(s.output) as shard:
        assert len(shard) == 0
        assert list(shard._file.get_slice("aux_hidden_states").get_shape()) == [0, 3 * meta["hidden_size"]]


def test_overlong_drop_is_counted_in_metadata(traces, hs_target, tmp_path):
    s = job_for(traces, hs_target, tmp_path / "out")
    meta = extract.extract_shards(settings(max_seq_len=44, overlong="drop"), [s])[0]
    assert meta["overlong"]["policy"] == "drop" and meta["overlong"]["dropped"] > 0
    assert meta["num_samples"] == 7 - meta["overlong"]["dropped"]
    assert set(meta["overlong"]["dropped_ids"]).isdisjoint(meta["ids"])


LAUNCHERS = {
    "accelerate": ["accelerate", "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
                   "--dynamo_backend", "no"],
    # what rule extract_hidden_states runs: processes clamped to the visible GPUs (none here: --cpu)
    "rule": ["python", "-m", "eagle3_pipeline.launch", "--gpus", "1", "--mode", "ddp",
             "--job-key", "t/1", "--"],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_accelerate_launch_command(traces, hs_target, tmp_path, launcher):
    """The command rule extract_hidden_states runs, on CPU, one process."""
    out = tmp_path / "hidden_states" / "train"
    out.mkdir(parents=True)
    jobs = rule_jobs([str(traces)], [str(out / "shard-00001.safetensors")], [str(out / "shard-00001.json")],
                     1, str(hs_target / "config.json"), str(tmp_path / "work"))  # fmt: skip
    hidden_states = HiddenStatesSettings(
        backend="transformers", layers=(1, 3, 5), max_seq_len=2048, batch_tokens=8192
    )
    job_file = write_jobs(hidden_states, jobs, tmp_path / "work" / "job.json")
    head = LAUNCHERS[launcher]
    cmd = [str(Path(sys.executable).with_name(head[0])), *head[1:], "-m", "eagle3_pipeline.hidden_states",
           str(job_file)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | {"CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((out / "shard-00001.json").read_text())
    assert meta["ids"] == ["id0007", "id0008"] and meta["aux_layers_vllm"] == [2, 4, 6]
    assert meta["compute_dtype"] == "bfloat16"
    with HiddenStateShard(out / "shard-00001.safetensors") as shard:
        assert [len(x["input_ids"]) for x in shard] == [int(o) for o in shard.offsets.diff()]


class SequentialRank:
    """Rank `index` of `world` in a data-parallel job, run one after the other in this process
    (the barrier is the order of the calls: non-main ranks first, rank 0 last)."""

    def __init__(self, index: int, world: int) -> None:
        self.process_index, self.num_processes = index, world
        self.is_main_process = index == 0
        self.device = torch.device("cpu")

    def wait_for_everyone(self) -> None:
        pass


def test_data_parallel_ranks_split_batches_and_rank0_merges(traces, hs_target, tmp_path, monkeypatch):
    reference = job_for(traces, hs_target, tmp_path / "ref")
    extract.extract_shards(HS, [reference])
    s = job_for(traces, hs_target, tmp_path / "out")
    ran: dict[int, list] = {0: [], 1: [], 2: []}
    real = backend.run_batch
    # what rank 0 does before the first barrier: the work folder for this plan
    parts.prepare_work(s.work, parts.fingerprint(HS, plan.plan_shard(HS, s)))
    for rank in (1, 2, 0):
        monkeypatch.setattr(backend, "run_batch", lambda *a, r=rank: ran[r].append(a[2]) or real(*a))
        result = extract.extract_shards(HS, [s], state=SequentialRank(rank, 3))[0]
        assert (result is None) == (rank != 0)
    assert all(ran.values()) and sorted(i for b in sum(ran.values(), []) for i in b) == list(range(7))
    with HiddenStateShard(s.output) as got, HiddenStateShard(reference.output) as want:
        for a, b in zip(got, want, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a)


def test_one_job_extracts_every_split_with_one_load(traces, hs_tokenizer, hs_target, tmp_path, monkeypatch):
    validation = write_traces(tmp_path / "validation.parquet", trace_rows(hs_tokenizer, 2, shard=0, start=20))
    loads = []
    real_load = capture.load_target
    monkeypatch.setattr(capture, "load_target", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    jobs = [
        job_for(traces, hs_target, tmp_path / "train"),
        job_for(validation, hs_target, tmp_path / "validation"),
    ]
    metas = extract.extract_shards(HS, jobs)
    assert len(loads) == 1
    assert [m["num_samples"] for m in metas] == [7, 2]
    assert metas[1]["ids"] == ["id0020", "id0021"]
    assert all(job.output.exists() and job.metadata.exists() for job in jobs)
    alone = job_for(validation, hs_target, tmp_path / "alone")
    extract.extract_shards(HS, [alone])  # a fresh load: the shared model leaves nothing behind (hooks)
    with HiddenStateShard(jobs[1].output) as shared, HiddenStateShard(alone.output) as fresh:
        for a, b in zip(shared, fresh, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_job_dying_in_its_second_split_keeps_the_first_splits_work(
    traces, hs_tokenizer, hs_target, tmp_path, monkeypatch
):
    validation = write_traces(tmp_path / "validation.parquet", trace_rows(hs_tokenizer, 2, shard=0, start=20))
    jobs = [
        job_for(traces, hs_target, tmp_path / "train"),
        job_for(validation, hs_target, tmp_path / "validation"),
    ]
    real_run_batch, calls = backend.run_batch, []

    def dies_in_validation(model, seqs, batch, layers, dtype):
        if seqs[batch[0]].id.startswith("id002"):
            raise KeyboardInterrupt("preempted")
        calls.append(batch)
        return real_run_batch(model, seqs, batch, layers, dtype)

    monkeypatch.setattr(backend, "run_batch", dies_in_validation)
    with pytest.raises(KeyboardInterrupt):
        extract.extract_shards(HS, jobs)
    # nothing committed (Snakemake would delete it): the train split packed in its work folder, once
    assert not jobs[0].output.exists() and not jobs[0].metadata.exists()
    train_bytes = packing.packed_path(jobs[0]).read_bytes()
    assert not list((jobs[0].work / "parts").glob("*.safetensors"))  # each part deleted once packed
    monkeypatch.setattr(backend, "run_batch", lambda *a: calls.append(a[2]) or real_run_batch(*a))
    first_attempt = len(calls)
    extract.extract_shards(HS, jobs)
    assert sorted(i for b in calls[first_attempt:] for i in b) == [0, 1]  # only validation's 2 samples ran
    assert jobs[0].output.read_bytes() == train_bytes  # the packed file committed as it was
    assert jobs[1].metadata.exists() and not jobs[0].work.exists() and not jobs[1].work.exists()


def test_a_shard_is_on_disk_once_while_it_is_packed(traces, hs_target, tmp_path, monkeypatch):
    """The parts are moved into the packed file one at a time: the work folder never holds the states
    twice (planning/window_plan.py counts a shard once, plus one batch), and a job killed while packing
    resumes."""
    s = job_for(traces, hs_target, tmp_path / "out")
    real_move, peaks, moved = packing._move_part, [], []

    def measured(shard, parts_dir, b, *args):
        allocated = sum(p.stat().st_blocks * 512 for p in s.work.rglob("*") if p.is_file())
        peaks.append(allocated)
        if len(moved) == 2:
            raise KeyboardInterrupt("killed while packing")
        moved.append(b)
        real_move(shard, parts_dir, b, *args)

    monkeypatch.setattr(packing, "_move_part", measured)
    with pytest.raises(KeyboardInterrupt):
        extract.extract_shards(HS, [s])
    assert len(list((s.work / "parts").glob("*.packed"))) == 2  # two parts moved, then killed
    monkeypatch.setattr(packing, "_move_part", lambda *a: measured(*a) if len(moved) < 2 else real_move(*a))
    calls = []
    real_run_batch = backend.run_batch
    monkeypatch.setattr(backend, "run_batch", lambda *a: calls.append(1) or real_run_batch(*a))
    extract.extract_shards(HS, [s])
    assert calls == []  # the resume packs the rest: no batch computed again
    states = s.output.stat().st_size
    part_bound = 100 * 4 * 128 * 2 + 64 * 1024  # one batch (batch_tokens 100, 4 x H bf16) + headers, blocks
    assert max(peaks) <= states + part_bound, (max(peaks), states)
    with HiddenStateShard(s.output) as shard:
        assert len(shard) == 7
