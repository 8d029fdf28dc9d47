"""merge_traces on synthetic generation shards (tests/support/traces.py): accounting, checks,
filters, the id split, and the exports."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from snakemake.iocontainers import Namedlist
from support.traces import IDENTITY, generation_rows, write_generation_shards, write_identity

from eagle3_pipeline.settings import TracesSettings, runtime_only, section
from eagle3_pipeline.traces import (
    GENERATION_SCHEMA,
    TraceError,
    TraceOutputs,
    filter_shard_traces,
    merge_traces,
    split_of,
    split_traces,
)
from eagle3_pipeline.traces.export import json_string
from eagle3_pipeline.traces.filters import REASONS


def _traces(**fields) -> TracesSettings:
    """The schema's traces.* with `fields`; no failed-row limit unless given: the synthetic shards fail
    more than the schema's 1% on purpose (the limit has its own test)."""
    return TracesSettings(**{"max_failed_fraction": 1.0, **fields})


def _merge(tmp_path: Path, shards: list[Path], traces: TracesSettings | None = None, **kwargs) -> dict:
    server = write_identity(tmp_path / "server" / "identity.json")
    return merge_traces(
        shards, server, TraceOutputs.in_dir(tmp_path / "traces"), traces or _traces(), **kwargs
    )


def _write(path: Path, frame: pl.DataFrame) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path)
    return path


def _shard_path(tmp_path: Path, k: int) -> Path:
    return tmp_path / "generations" / f"shard-{k:05d}.parquet"


def _outputs_absent(tmp_path: Path) -> bool:
    return not any((tmp_path / "traces").glob("*")) if (tmp_path / "traces").exists() else True


def test_every_prompt_is_accounted_for(tmp_path, generation_shards):
    stats = _merge(tmp_path, generation_shards)
    out = TraceOutputs.in_dir(tmp_path / "traces")
    assert stats["prompts"] == 200 == stats["ok"] + stats["skipped"] + stats["failed"]
    assert stats["prompts"] == stats["kept"] + sum(stats["dropped"].values())
    assert stats["skipped"] > 0 and stats["failed"] > 0
    assert stats["dropped"]["failed"] == stats["failed"] and stats["dropped"]["skipped"] == stats["skipped"]
    for shard in stats["shards"]:
        assert shard["prompts"] == 50 == shard["ok"] + shard["skipped"] + shard["failed"]
        assert shard["prompts"] == shard["kept"] + sum(shard["dropped"].values())
    traces = pl.read_parquet(out.traces)
    assert traces.height == stats["kept"] == stats["train"] + stats["validation"]
    assert traces.columns == [*GENERATION_SCHEMA, "split"]
    assert traces["status"].unique().to_list() == ["ok"]
    assert traces["shard"].is_sorted()  # shard order kept: extraction takes shard k's rows
    assert json.loads(out.stats.read_text())["kept"] == stats["kept"]


def test_train_and_validation_partition_the_traces(tmp_path, generation_shards):
    stats = _merge(tmp_path, generation_shards, _traces(validation_fraction=0.3))
    out = TraceOutputs.in_dir(tmp_path / "traces")
    train_path, validation_path = (
        tmp_path / "traces" / "train.parquet",
        tmp_path / "traces" / "validation.parquet",
    )
    counts = split_traces(out.traces, train_path, validation_path)
    traces, train, validation = (pl.read_parquet(p) for p in (out.traces, train_path, validation_path))
    assert counts == {"train": train.height, "validation": validation.height}
    assert train.height + validation.height == traces.height
    assert set(train["id"]) | set(validation["id"]) == set(traces["id"])
    assert train["split"].unique().to_list() == ["train"] and validation["split"].unique().to_list() == [
        "validation"
    ]
    assert 0.15 < validation.height / traces.height < 0.45
    assert train.schema == validation.schema == traces.schema
    assert stats["splits"] == {"train": train.height, "validation": validation.height}


def test_split_refuses_traces_without_a_valid_split(tmp_path):
    no_split = _write(tmp_path / "a.parquet", pl.DataFrame({"id": ["x"]}))
    with pytest.raises(TraceError, match="no `split` column; rerun merge_traces"):
        split_traces(no_split, tmp_path / "train.parquet", tmp_path / "validation.parquet")
    odd = _write(tmp_path / "b.parquet", pl.DataFrame({"id": ["x", "y"], "split": ["train", "test"]}))
    with pytest.raises(TraceError, match=r"\['test'\] are not train/validation"):
        split_traces(odd, tmp_path / "train.parquet", tmp_path / "validation.parquet")
    assert not (tmp_path / "train.parquet").exists()


def test_a_split_without_rows_is_an_empty_file_with_the_schema(tmp_path):
    only_train = _write(tmp_path / "t.parquet", pl.DataFrame({"id": ["x", "y"], "split": ["train", "train"]}))
    counts = split_traces(only_train, tmp_path / "train.parquet", tmp_path / "validation.parquet")
    assert counts == {"train": 2, "validation": 0}
    validation = pl.read_parquet(tmp_path / "validation.parquet")
    assert validation.height == 0 and validation.schema == pl.read_parquet(only_train).schema


def test_split_rule_script_writes_both_splits(tmp_path, generation_shards, monkeypatch):
    """scripts/split_traces.py with the rule's input/output names, on a real merge's traces.parquet."""
    _merge(tmp_path, generation_shards, _traces(validation_fraction=0.3))
    train, validation = tmp_path / "traces" / "train.parquet", tmp_path / "traces" / "validation.parquet"
    snakemake = SimpleNamespace(  # Snakemake's own containers, as the script: directive passes them
        rule="split_traces",
        wildcards=Namedlist(),
        input=Namedlist([str(TraceOutputs.in_dir(tmp_path / "traces").traces)]),
        output=SimpleNamespace(train=str(train), validation=str(validation)),
        params=Namedlist(),
        log=[str(tmp_path / "split_traces.log")],
    )
    monkeypatch.setattr(sys, "stderr", sys.stderr)  # the script sends stderr to the log; restored after
    runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "split_traces.py"), {"snakemake": snakemake})
    assert pl.read_parquet(train)["split"].unique().to_list() == ["train"]
    assert pl.read_parquet(validation)["split"].unique().to_list() == ["validation"]
    assert "validation.parquet" in (tmp_path / "split_traces.log").read_text()


def test_shards_with_gaps_and_failures(tmp_path):
    # shard numbers with gaps, unequal sizes, and a shard where every request failed
    shards = [
        _write(_shard_path(tmp_path, 0), generation_rows(0, 30)),
        _write(_shard_path(tmp_path, 3), generation_rows(3, 7, first_row=100)),
        _write(_shard_path(tmp_path, 7), generation_rows(7, 20, first_row=200, failed=1.0)),
    ]
    stats = _merge(tmp_path, shards)
    by_shard = {s["shard"]: s for s in stats["shards"]}
    assert sorted(by_shard) == [0, 3, 7]
    assert by_shard[7]["failed"] == 20 and by_shard[7]["kept"] == 0
    assert by_shard[7]["dropped"]["failed"] == 20
    assert by_shard[3]["prompts"] == 7
    assert stats["prompts"] == 57 == stats["kept"] + sum(stats["dropped"].values())


def test_a_shard_that_does_not_add_up_fails_naming_it(tmp_path, generation_shards):
    bad = generation_rows(2, 50).with_columns(
        status=pl.when(pl.col("row") == 101).then(pl.lit("pending")).otherwise(pl.col("status"))
    )
    _write(generation_shards[2], bad)
    with pytest.raises(TraceError, match=r"00002.*prompts != ok \+ skipped \+ failed"):
        _merge(tmp_path, generation_shards)
    assert _outputs_absent(tmp_path)


def test_generation_shard_missing_a_prompt_fails(tmp_path, generation_shards):
    prompts = []
    for k, path in enumerate(generation_shards):
        ids = pl.read_parquet(path, columns=["id"])
        if k == 1:  # a prompt the generator never wrote a row for
            ids = pl.concat([ids, pl.DataFrame({"id": ["never-generated"]})])
        prompts.append(_write(tmp_path / "prompts" / f"shard-{k:05d}.parquet", ids))
    with pytest.raises(TraceError, match=r"shard\(s\) 00001.*51 prompts, 50 rows"):
        _merge(tmp_path, generation_shards, prompts=prompts)


def test_generation_shard_with_other_ids_than_its_prompts_fails(tmp_path, generation_shards):
    prompts = []
    for k, path in enumerate(generation_shards):
        ids = pl.read_parquet(path, columns=["id"])
        if k == 3:  # same count, one id replaced: the prompts changed after generation
            ids = ids.with_columns(
                pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("new")).otherwise("id").alias("id")
            )
        prompts.append(_write(tmp_path / "prompts" / f"shard-{k:05d}.parquet", ids))
    with pytest.raises(TraceError, match=r"00003.*ids differ from the prompt shard"):
        _merge(tmp_path, generation_shards, prompts=prompts)


def test_matching_prompts_pass(tmp_path, generation_shards):
    prompts = [
        _write(tmp_path / "prompts" / f"shard-{k:05d}.parquet", pl.read_parquet(p, columns=["id"]).reverse())
        for k, p in enumerate(generation_shards)
    ]
    assert _merge(tmp_path, generation_shards, prompts=prompts)["prompts"] == 200


def test_duplicated_ids_across_shards_fail_naming_the_shards(tmp_path, generation_shards):
    stolen = generation_rows(0, 50).head(1).with_columns(shard=pl.lit(2, pl.Int32))
    _write(generation_shards[2], pl.concat([generation_rows(2, 50), stolen]))
    with pytest.raises(TraceError, match=r"1 id\(s\) occur more than once, in shard\(s\) 00000, 00002"):
        _merge(tmp_path, generation_shards)


def test_mixed_servers_are_refused(tmp_path, generation_shards):
    _write(generation_shards[3], generation_rows(3, 50, identity="0ld5erver"))
    with pytest.raises(TraceError) as error:
        _merge(tmp_path, generation_shards)
    message = str(error.value)
    assert (
        "mixed servers" in message and "00003" in message and "0ld5erver" in message and IDENTITY in message
    )
    assert f"rm {generation_shards[3]}" in message and "00000" not in message
    assert _outputs_absent(tmp_path)


def test_a_renamed_shard_file_fails(tmp_path, generation_shards):
    generation_shards[1].rename(_shard_path(tmp_path, 9))
    shards = [generation_shards[0], _shard_path(tmp_path, 9), *generation_shards[2:]]
    with pytest.raises(TraceError, match=r"00009 hold rows whose `shard` column differs"):
        _merge(tmp_path, shards)


def test_shards_written_with_other_dtypes_are_cast(tmp_path, generation_shards):
    # an all-null column stored as Null, int64 token ids: same meaning, merged
    loose = generation_rows(1, 50).with_columns(
        system=pl.lit(None), prompt_token_ids=pl.col("prompt_token_ids").cast(pl.List(pl.Int64))
    )
    _write(generation_shards[1], loose)
    stats = _merge(tmp_path, generation_shards)
    traces = pl.read_parquet(TraceOutputs.in_dir(tmp_path / "traces").traces)
    assert traces.schema["prompt_token_ids"] == pl.List(pl.Int32) and stats["prompts"] == 200


def test_a_shard_missing_a_column_fails_naming_it(tmp_path, generation_shards):
    _write(generation_shards[2], generation_rows(2, 50).drop("reasoning"))
    with pytest.raises(TraceError, match=r"shard-00002.parquet lacks column\(s\) \['reasoning'\]"):
        _merge(tmp_path, generation_shards)


def test_truncated_rows_are_kept_or_dropped_by_config(tmp_path, generation_shards):
    truncated = sum(
        pl.read_parquet(p).filter(pl.col("finish_reason") == "length").height for p in generation_shards
    )
    assert truncated > 0
    kept = _merge(tmp_path / "keep", generation_shards, _traces(drop_truncated=False))
    dropped = _merge(tmp_path / "drop", generation_shards, _traces(drop_truncated=True))
    assert kept["dropped"]["truncated"] == 0 and kept["kept_truncated"] == truncated
    assert dropped["dropped"]["truncated"] == truncated and dropped["kept_truncated"] == 0
    assert dropped["kept"] == kept["kept"] - truncated


def _with_edits(shard: int) -> pl.DataFrame:
    """Row 0 and 1 of the shard: blank thinking and answer / no completion token ids."""
    index = pl.int_range(pl.len())
    return generation_rows(shard, 50, failed=0, skipped=0, truncated=0).with_columns(
        reasoning=pl.when(index == 0).then(pl.lit("  ")).otherwise("reasoning"),
        content=pl.when(index == 0).then(pl.lit(None)).otherwise("content"),
        completion_token_ids=pl.when(index == 1)
        .then(pl.lit([], pl.List(pl.Int32)))
        .otherwise("completion_token_ids"),
    )


def test_empty_replies_and_rows_without_token_ids(tmp_path):
    shards = [_write(_shard_path(tmp_path, 0), _with_edits(0))]
    dropped = _merge(tmp_path / "a", shards, _traces(drop_empty=True))
    assert (
        dropped["dropped"]["empty"] == 1 and dropped["dropped"]["no_token_ids"] == 1 and dropped["kept"] == 48
    )
    kept = _merge(tmp_path / "b", shards, _traces(drop_empty=False))
    assert kept["dropped"]["empty"] == 0 and kept["kept"] == 49


def test_exact_duplicates_within_a_shard_keep_the_first_and_across_shards_are_counted(tmp_path):
    first = generation_rows(0, 20, failed=0, skipped=0)
    later = generation_rows(1, 20, failed=0, skipped=0)
    copy_columns = ["system", "question", "reasoning", "content"]

    def repeat(target: pl.DataFrame, source: pl.DataFrame) -> pl.DataFrame:
        """target with its first 3 rows' texts replaced by source's first 3 (other ids)."""
        head = source.head(3).select(copy_columns).hstack(target.head(3).drop(copy_columns))
        return pl.concat([head.select(target.columns), target.slice(3)])

    # shard 1's rows 3-5 repeat its rows 0-2 (within); shard 0's rows 0-2 repeat shard 1's rows 10-12
    later = repeat(later, later.slice(3))
    first = repeat(first, later.slice(10))
    first_rows = pl.int_range(pl.len()) < 3
    near = later.with_columns(  # not exact: kept
        reasoning=pl.when(first_rows).then(pl.col("reasoning") + "!").otherwise(pl.col("reasoning"))
    )
    shards = [_write(_shard_path(tmp_path, 0), first), _write(_shard_path(tmp_path, 1), later)]
    stats = _merge(tmp_path / "a", shards)
    assert stats["dropped"]["duplicate"] == 3
    assert {s["shard"]: s["dropped"]["duplicate"] for s in stats["shards"]} == {0: 0, 1: 3}
    # a repeat across shards is kept (each shard's traces depend on that shard alone) and counted
    assert stats["cross_shard_repeats"] == 2 * 3
    traces = pl.read_parquet(TraceOutputs.in_dir(tmp_path / "a" / "traces").traces)
    kept = set(traces["id"])
    assert set(later.head(3)["id"]) <= kept and not set(later.slice(3, 3)["id"]) & kept  # first kept
    assert set(first.head(3)["id"]) <= set(traces["id"])
    assert _merge(tmp_path / "b", shards, _traces(drop_duplicates=False))["dropped"]["duplicate"] == 0
    _write(shards[1], near)
    assert _merge(tmp_path / "c", shards)["dropped"]["duplicate"] == 0


def _shard_outputs(directory: Path, k: int) -> dict[str, Path]:
    return {split: directory / split / f"shard-{k:05d}.parquet" for split in ("train", "validation")}


def test_per_shard_traces_are_the_merged_traces_shard_by_shard(tmp_path, generation_shards):
    server = write_identity(tmp_path / "server" / "identity.json")
    prompts = [
        _write(tmp_path / "prompts" / f"shard-{k:05d}.parquet", pl.read_parquet(p, columns=["id"]))
        for k, p in enumerate(generation_shards)
    ]
    filters = _traces(validation_fraction=0.2)
    merge_traces(generation_shards, server, TraceOutputs.in_dir(tmp_path / "traces"), filters, prompts)
    merged = pl.read_parquet(tmp_path / "traces" / "traces.parquet")
    for k, (generation, prompt) in enumerate(zip(generation_shards, prompts, strict=True)):
        outputs = _shard_outputs(tmp_path / "shards", k)
        counts = filter_shard_traces(generation, prompt, server, filters, outputs)
        for split, path in outputs.items():
            expected = merged.filter((pl.col("shard") == k) & (pl.col("split") == split))
            assert pl.read_parquet(path).equals(expected), (k, split)
            assert counts[split] == expected.height
    assert sum(pl.read_parquet(p).height for p in (tmp_path / "shards").rglob("*.parquet")) == merged.height


def test_per_shard_traces_check_their_prompts_and_server(tmp_path, generation_shards):
    server = write_identity(tmp_path / "server" / "identity.json")
    ids = pl.read_parquet(generation_shards[1], columns=["id"])
    prompt = _write(
        tmp_path / "prompts" / "shard-00001.parquet", pl.concat([ids, pl.DataFrame({"id": ["x"]})])
    )
    outputs = _shard_outputs(tmp_path / "shards", 1)
    with pytest.raises(TraceError, match=r"00001.*51 prompts, 50 rows"):
        filter_shard_traces(generation_shards[1], prompt, server, _traces(), outputs)
    other = write_identity(tmp_path / "other" / "identity.json", identity="another-server")
    _write(prompt, ids)
    with pytest.raises(TraceError, match="mixed servers|another|server"):
        filter_shard_traces(generation_shards[1], prompt, other, _traces(), outputs)
    assert not any(path.exists() for path in outputs.values())


def test_split_is_stable_as_the_corpus_grows(tmp_path):
    small = write_generation_shards(tmp_path / "small", 3, 40)
    large = write_generation_shards(tmp_path / "large", 8, 40)  # the same 3 shards, then 5 more
    _merge(tmp_path / "a", small, _traces(validation_fraction=0.2))
    _merge(tmp_path / "b", large, _traces(validation_fraction=0.2))
    before = dict(
        pl.read_parquet(tmp_path / "a" / "traces" / "traces.parquet").select("id", "split").iter_rows()
    )
    after = dict(
        pl.read_parquet(tmp_path / "b" / "traces" / "traces.parquet").select("id", "split").iter_rows()
    )
    assert len(after) > len(before) and all(after[i] == s for i, s in before.items())


def test_split_depends_on_the_id_alone():
    ids = [f"id-{i}" for i in range(4000)]
    low = {i for i in ids if split_of(i, 0.05) == "validation"}
    high = {i for i in ids if split_of(i, 0.2) == "validation"}
    assert low < high  # raising the fraction only moves ids from train to validation
    assert 0.03 < len(low) / 4000 < 0.07 and 0.17 < len(high) / 4000 < 0.23
    assert not {i for i in ids if split_of(i, 0.0) == "validation"}
    # pinned: BLAKE2b-64 of the id; a change here would reshuffle every existing corpus
    assert [split_of(f"id-{i}", 0.1) for i in range(12)].count("validation") == sum(
        int.from_bytes(__import__("hashlib").blake2b(f"id-{i}".encode(), digest_size=8).digest(), "big")
        < 0.1 * 2**64
        for i in range(12)
    )


def test_conversations_jsonl(tmp_path, generation_shards):
    stats = _merge(tmp_path, generation_shards)
    out = TraceOutputs.in_dir(tmp_path / "traces")
    lines = [json.loads(line) for line in out.conversations.read_text().splitlines()]
    traces = pl.read_parquet(out.traces)
    assert len(lines) == stats["kept"] and [line["id"] for line in lines] == traces["id"].to_list()
    for line, row in zip(lines, traces.iter_rows(named=True), strict=True):
        roles = [m["role"] for m in line["conversations"]]
        assert roles == (["system"] if row["system"] else []) + ["user", "assistant"]
        assistant = line["conversations"][-1]
        assert assistant == {
            "role": "assistant",
            "content": row["content"] or "",
            "reasoning_content": row["reasoning"] or "",
        }
        assert all("reasoning_content" not in m for m in line["conversations"][:-1])
        assert line["conversations"][-2]["content"] == row["question"]


def test_stats_and_plots(tmp_path, generation_shards):
    stats = _merge(tmp_path, generation_shards)
    out = TraceOutputs.in_dir(tmp_path / "traces")
    for plot in (out.lengths_plot, out.counts_plot):
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(stats["dropped"]) == set(REASONS)
    lengths = stats["lengths"]
    assert lengths["prompt_tokens"]["count"] == stats["kept"] and 16 <= lengths["prompt_tokens"]["p50"] <= 64
    assert (
        lengths["thinking_tokens"]["sum"] + lengths["answer_tokens"]["sum"]
        == lengths["completion_tokens"]["sum"]
    )
    assert sum(b["count"] for b in stats["histograms"]["prompt_tokens"]) == stats["kept"]
    assert sum(sum(v.values()) for v in stats["by_source"].values()) == stats["prompts"]
    assert sum(stats["kept_by_source"].values()) == stats["kept"]
    assert "estimate" in stats["token_counts"]


def test_nothing_kept_fails(tmp_path):
    shards = [_write(_shard_path(tmp_path, 0), generation_rows(0, 10, failed=1.0))]
    with pytest.raises(TraceError, match="no trace kept out of 10 prompts"):
        _merge(tmp_path, shards)


def test_unknown_traces_key_is_refused():
    assert section(TracesSettings, {"drop_empty": False}).drop_empty is False
    with pytest.raises(TypeError, match="TracesSettings has no field 'drop_trunc'"):
        section(TracesSettings, {"drop_trunc": True})


def test_bad_identity_file(tmp_path, generation_shards):
    server = tmp_path / "identity.json"
    server.write_text("{}")
    with pytest.raises(TraceError, match="rerun the snapshot_server rule"):
        merge_traces(generation_shards, server, TraceOutputs.in_dir(tmp_path / "t"), _traces())


def test_json_strings_round_trip():
    nasty = ['quote " backslash \\ slash /', "new\nline\ttab\r\x00\x1f\x7f", "é 😀 \u2028", "", '{"a": [1]}']
    encoded = pl.select(json_string(pl.Series(nasty))).to_series().to_list()
    assert [json.loads(e) for e in encoded] == nasty


def test_schema_is_the_generators():
    """The columns read here are the columns generate_shard writes (same names, order and types)."""
    from eagle3_pipeline.generate.shard import OUTPUT_SCHEMA

    assert pl.Schema(OUTPUT_SCHEMA) == pl.Schema(GENERATION_SCHEMA)


def test_rule_script_reads_the_named_inputs_and_outputs(
    tmp_path, generation_shards, server_identity, monkeypatch
):
    """scripts/merge_traces.py with the rule's input/output/params names (a namespace for `snakemake`)."""
    prompts = [
        _write(tmp_path / "prompts" / p.name, pl.read_parquet(p, columns=["id"])) for p in generation_shards
    ]
    out = TraceOutputs.in_dir(tmp_path / "traces")
    snakemake = SimpleNamespace(  # Snakemake's own containers, as the script: directive passes them
        rule="merge_traces",
        wildcards=Namedlist(),
        input=Namedlist(
            fromdict={"generations": generation_shards, "prompts": prompts, "server": str(server_identity)}
        ),
        output=SimpleNamespace(**{name: str(getattr(out, name)) for name in vars(out)}),
        params=Namedlist(
            fromdict={
                # the whole filters, as the rule records them (the script refuses a partial section)
                "traces": {
                    "drop_truncated": True,
                    "drop_empty": True,
                    "drop_duplicates": True,
                    "validation_fraction": 0.2,
                },
                # as rules/traces.smk; these shards fail more than the schema's 1% on purpose
                "runtime": runtime_only(traces={"max_failed_fraction": 1.0}),
            }
        ),
        log=[str(tmp_path / "merge_traces.log")],
    )
    monkeypatch.setattr(sys, "stderr", sys.stderr)  # the script sends stderr to the log; restored after
    runpy.run_path(str(Path(__file__).parents[2] / "scripts" / "merge_traces.py"), {"snakemake": snakemake})
    stats = json.loads(out.stats.read_text())
    assert stats["filters"]["drop_truncated"] is True and stats["dropped"]["truncated"] > 0
    assert all(getattr(out, name).exists() for name in vars(out))


def _generator_shard(tmp_path: Path, k: int) -> tuple[Path, Path]:
    """A prompt shard and the generation shard generate_shard's own table code makes of it."""
    from eagle3_pipeline.generate.client import Sampling
    from eagle3_pipeline.generate.shard import output_frame, write_output
    from eagle3_pipeline.prompts import PROMPT_SCHEMA

    prompts = pl.DataFrame(
        {
            "id": [f"p{k}-{i}" for i in range(4)],
            "source": "demo-math",
            "row": [10 * k + i for i in range(4)],
            "turn": 0,
            "system": [None, "Be brief.", None, None],
            "question": [f"What is {i} + {k}?" for i in range(4)],
            "original_answer": "",
        },
        schema=PROMPT_SCHEMA,
    )
    ok = {"reasoning": "I add them.", "content": "It is 5.", "finish_reason": "stop"}
    ok |= {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5, 6, 7], "prompt_tokens": 3}
    ok |= {"completion_tokens": 4, "status": "ok", "reason": None, "latency_s": 0.5}
    outcomes = [
        ok | {"content": f"It is {i + k}."} for i in range(2)
    ] + [  # a reply cut off by max_tokens, a prompt too long for the server
        ok | {"content": None, "finish_reason": "length"},
        {"status": "skipped", "reason": "HTTP 400: context length", "latency_s": 0.1},
    ]
    records = prompts.to_dicts()
    results = {r["id"]: outcome for r, outcome in zip(records, outcomes, strict=True)}
    frame = output_frame(records, results, k, Sampling("demo", 64, 0.6, 0.95, 0), IDENTITY)
    prompt_path = _write(tmp_path / "prompts" / f"shard-{k:05d}.parquet", prompts)
    write_output(frame, _shard_path(tmp_path, k))
    return prompt_path, _shard_path(tmp_path, k)


def test_shards_from_the_generators_own_table_code(tmp_path):
    prompts, shards = zip(*(_generator_shard(tmp_path, k) for k in range(2)), strict=True)
    stats = _merge(tmp_path, list(shards), prompts=list(prompts))
    assert (stats["prompts"], stats["ok"], stats["skipped"], stats["kept"]) == (8, 6, 2, 6)
    assert stats["kept_truncated"] == 2
    lines = (tmp_path / "traces" / "conversations.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["conversations"][0] == {"role": "system", "content": "Be brief."}


def test_more_failed_rows_than_max_failed_fraction_stop_the_merge_with_the_numbers(tmp_path):
    shards = [_shard_path(tmp_path, k) for k in range(2)]
    _write(shards[0], generation_rows(0, 100, failed=0.0))
    _write(shards[1], generation_rows(1, 100, failed=0.1))
    failed = pl.read_parquet(shards[1])["status"].eq("failed").sum()
    assert failed > 2
    with pytest.raises(
        TraceError,
        match=rf"{failed} of 200 prompts failed .* traces.max_failed_fraction = 1.00%.*00001: {failed}",
    ):
        _merge(tmp_path / "strict", shards, _traces(max_failed_fraction=0.01))
    stats = _merge(tmp_path / "lenient", shards, _traces(max_failed_fraction=0.2))
    assert stats["failed"] == failed
