"""Prompts: formats, turns, damaged rows with reasons, stable ids, shards stable as num_samples grows."""

import json
import logging
from pathlib import Path

import polars as pl
import pytest

from eagle3_pipeline import prompts as P
from eagle3_pipeline.planning import blocks
from eagle3_pipeline.settings import DatasetSettings


def conv(*turns, source="src"):
    return {"conversations": [{"from": f, "value": v} for f, v in turns], "source": source}


def rows(n, source="src"):
    return [conv(("human", f"question {i}"), ("gpt", f"answer {i}"), source=source) for i in range(n)]


def write_jsonl(path, items):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return str(path)


def dataset(path, num_samples, shard_size=4, seed=0, turns="first"):
    return {
        "path": str(path),
        "num_samples": num_samples,
        "shard_size": shard_size,
        "seed": seed,
        "turns": turns,
    }


def run(tmp_path, cfg, name="out"):
    """prepare_prompts, then write_prompt_shard for every shard, as the two rules do."""
    out = tmp_path / name
    settings = DatasetSettings(**cfg)
    counts = P.prepare_prompts(
        settings, "none", cfg["num_samples"], str(out / "selection.parquet"), str(out / "skipped.parquet")
    )
    n, size = -(-cfg["num_samples"] // cfg["shard_size"]), cfg["shard_size"]
    paths = [str(out / f"shard-{k:05d}.parquet") for k in range(n)]
    for k, path in enumerate(paths):
        P.write_prompt_shard(
            str(out / "selection.parquet"), k * size, min((k + 1) * size, cfg["num_samples"]), path
        )
    return counts, paths, pl.read_parquet(out / "skipped.parquet")


def test_jsonl_first_turn_with_system_and_original_answer(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [conv(("system", "be brief"), ("human", "q1"), ("gpt", "a1"), ("human", "q2"), ("gpt", "a2"))],
    )
    counts, paths, _ = run(tmp_path, dataset(path, 1, 1))
    frame = pl.read_parquet(paths[0])
    assert frame.schema == pl.Schema(P.PROMPT_SCHEMA)
    assert frame.row(0, named=True) | {"id": None} == {
        "id": None,
        "source": "src",
        "row": 0,
        "turn": 1,
        "system": "be brief",
        "question": "q1",
        "original_answer": "a1",
    }


def test_turns_all_gives_each_human_turn_its_own_stable_id(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [conv(("human", "q1"), ("gpt", "a1"), ("human", "q2"))])
    _, paths, _ = run(tmp_path, dataset(path, 2, 2, turns="all"))
    frame = pl.read_parquet(paths[0]).sort("turn")
    assert frame["question"].to_list() == ["q1", "q2"]
    assert frame["original_answer"].to_list() == ["a1", None]
    assert frame["id"].n_unique() == 2
    _, paths_first, _ = run(tmp_path, dataset(path, 1, 1), name="first")
    assert pl.read_parquet(paths_first[0])["id"][0] in frame["id"].to_list()


def test_role_content_rows_and_formats_give_the_same_ids(tmp_path):
    items = rows(6)
    jsonl = write_jsonl(tmp_path / "d.jsonl", items)
    openai = [
        {
            "messages": [
                {"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]}
                for t in r["conversations"]
            ],
            "source": r["source"],
        }
        for r in items
    ]
    openai_path = write_jsonl(tmp_path / "o.jsonl", openai)
    pl.DataFrame(items).write_parquet(tmp_path / "d.parquet")
    folder = tmp_path / "folder"
    folder.mkdir()
    pl.DataFrame(items[:3]).write_parquet(folder / "part-0.parquet")
    pl.DataFrame(items[3:]).write_parquet(folder / "part-1.parquet")
    ids = []
    for name, path in [("j", jsonl), ("o", openai_path), ("p", tmp_path / "d.parquet"), ("f", folder)]:
        _, paths, skipped = run(tmp_path, dataset(path, 6, 6), name=name)
        assert skipped.height == 0
        ids.append(sorted(pl.read_parquet(paths[0])["id"]))
    assert ids[0] == ids[1] == ids[2] == ids[3]


def test_damaged_rows_are_counted_with_reasons(tmp_path, caplog):
    items = rows(3) + [
        "{not json",
        {"source": "x"},
        conv(("gpt", "only an answer")),
        conv(("human", ""), ("gpt", "a")),
        {"conversations": [{"from": "human", "value": 42}], "source": "x"},
        {"conversations": "a string", "source": "x"},
        {"conversations": [{"from": "alien", "value": "hi"}]},
        [1, 2],
        rows(1)[0],  # duplicate of row 0
    ]
    path = write_jsonl(tmp_path / "d.jsonl", items)
    with caplog.at_level(logging.WARNING):
        counts, paths, skipped = run(tmp_path, dataset(path, 8, 4))
    assert counts == {"usable": 3, "skipped": 9, "selected": 3}
    assert skipped.schema == pl.Schema(P.SKIPPED_SCHEMA)
    reasons = dict(zip(skipped["row"], skipped["reason"], strict=True))
    assert "not valid JSON" in reasons[3]
    assert "no 'conversations'" in reasons[4]
    assert reasons[5] == "no non-empty human turn"
    assert "empty" in reasons[6]
    assert "int, not a string" in reasons[7]
    assert "not a list" in reasons[8]
    assert "unknown role 'alien'" in reasons[9]
    assert "not an object" in reasons[10]
    assert reasons[11] == "duplicate"
    assert skipped.filter(pl.col("row") == 11)["id"][0] is not None
    # fewer usable rows than num_samples: trailing shard empty, a warning with the numbers
    assert pl.read_parquet(paths[1]).height == 0
    assert "holds 3 questions, not 4: the dataset has fewer usable questions than dataset.num_samples" in (
        caplog.text
    )


def test_ids_are_stable_and_independent_of_shard_size_and_num_samples(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", rows(20))
    _, a, _ = run(tmp_path, dataset(path, 20, 5), name="a")
    _, b, _ = run(tmp_path, dataset(path, 12, 7), name="b")
    ids_a = pl.concat([pl.read_parquet(p) for p in a]).select("id", "row")
    ids_b = pl.concat([pl.read_parquet(p) for p in b]).select("id", "row")
    assert ids_b.join(ids_a, on="id")["row"].to_list() == ids_b["row"].to_list()
    assert ids_a["row"].n_unique() == 20


def test_raising_num_samples_keeps_earlier_full_shards_byte_identical(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", rows(40))
    _, small, _ = run(tmp_path, dataset(path, 10, 4), name="small")
    _, large, _ = run(tmp_path, dataset(path, 30, 4), name="large")
    for k in range(2):  # shards 0 and 1 were full at num_samples=10
        assert Path(small[k]).read_bytes() == Path(large[k]).read_bytes()
    assert pl.read_parquet(small[2]).height == 2
    assert pl.read_parquet(large[2]).head(2).equals(pl.read_parquet(small[2]))
    _, again, _ = run(tmp_path, dataset(path, 30, 4), name="again")
    assert all(Path(x).read_bytes() == Path(y).read_bytes() for x, y in zip(large, again, strict=True))


def test_seed_changes_the_selection(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", rows(40))
    _, a, _ = run(tmp_path, dataset(path, 8, 8, seed=0), name="a")
    _, b, _ = run(tmp_path, dataset(path, 8, 8, seed=1), name="b")
    assert set(pl.read_parquet(a[0])["id"]) != set(pl.read_parquet(b[0])["id"])


def test_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(P.DatasetError, match="does not exist"):
        run(tmp_path, dataset(tmp_path / "nope.jsonl", 4))


def test_a_shard_is_its_rows_of_the_selection_read_by_row_group(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "SELECTION_ROW_GROUP", 8)
    path = write_jsonl(tmp_path / "d.jsonl", rows(40))
    _, paths, _ = run(tmp_path, dataset(path, 29, 3))  # shards straddle the row groups of 8
    selection = pl.read_parquet(tmp_path / "out" / "selection.parquet")
    assert selection.height == 29 and selection.schema == pl.Schema(P.PROMPT_SCHEMA)
    assert pl.concat([pl.read_parquet(p) for p in paths]).equals(selection)
    assert pl.read_parquet(paths[-1]).height == 2  # rows 27-28: the last shard is short


def test_a_bad_shard_range_or_selection_is_a_clear_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", rows(4))
    run(tmp_path, dataset(path, 4, 4))
    selection = str(tmp_path / "out" / "selection.parquet")
    with pytest.raises(ValueError, match=r"start must be >= 0 and <= stop"):
        P.write_prompt_shard(selection, 5, 4, str(tmp_path / "x.parquet"))
    with pytest.raises(P.DatasetError, match="cannot read the selection.*rerun prepare_prompts"):
        P.write_prompt_shard(str(tmp_path / "none.parquet"), 0, 4, str(tmp_path / "x.parquet"))
    pl.DataFrame({"id": ["a"]}).write_parquet(tmp_path / "other.parquet")
    with pytest.raises(P.DatasetError, match="not the prompt schema; rerun prepare_prompts"):
        P.write_prompt_shard(str(tmp_path / "other.parquet"), 0, 1, str(tmp_path / "x.parquet"))
    assert not (tmp_path / "x.parquet").exists()


def test_a_lone_surrogate_row_is_skipped_with_its_reason(tmp_path):
    lone = '{"conversations": [{"from": "human", "value": "bad \\ud800 text"}], "source": "x"}'
    path = write_jsonl(tmp_path / "d.jsonl", [*rows(3), lone])
    counts, paths, skipped = run(tmp_path, dataset(path, 4, 4))
    assert counts == {"usable": 3, "skipped": 1, "selected": 3}
    assert skipped.row(0, named=True) | {"reason": None} == {
        "row": 3,
        "source": "x",
        "reason": None,
        "id": None,
    }
    assert "lone surrogate" in skipped["reason"][0]
    assert pl.read_parquet(paths[0]).height == 3


def test_a_json_array_file_is_read_as_an_array_and_json_lines_still_work(tmp_path):
    items = rows(5)
    array = tmp_path / "array.json"
    array.write_text(json.dumps(items, indent=2))
    lines = write_jsonl(tmp_path / "lines.json", items)
    ids = [
        sorted(pl.read_parquet(run(tmp_path, dataset(p, 5, 5), name=n)[1][0])["id"])
        for n, p in [("a", array), ("l", lines), ("j", write_jsonl(tmp_path / "d.jsonl", items))]
    ]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 5


def test_no_usable_question_is_an_error_naming_the_dataset(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["{broken", {"source": "x"}])
    with pytest.raises(P.DatasetError, match=r"d.jsonl' holds no usable question \(2 rows skipped"):
        run(tmp_path, dataset(path, 4, 4))


def test_one_question_is_one_prompt_whatever_its_source_answer_or_spacing(tmp_path):
    items = [
        conv(("human", "What is 2 + 3?"), ("gpt", "5"), source="a"),
        conv(("human", "What is  2 + 3? \n"), ("gpt", "five"), source="b"),  # another source and answer
        conv(("system", "be brief"), ("human", "What is 2 + 3?"), ("gpt", "5")),  # another system turn
        conv(("human", "other"), ("gpt", "x"), ("human", "What is 2 + 3?"), ("gpt", "5")),  # a later turn
    ]
    path = write_jsonl(tmp_path / "d.jsonl", items)
    counts, paths, skipped = run(tmp_path, dataset(path, 8, 8, turns="all"))
    frame = pl.read_parquet(paths[0])
    assert counts["usable"] == 3 and frame["id"].n_unique() == frame.height == 3
    assert skipped["reason"].to_list() == ["duplicate", "duplicate"]
    assert skipped["row"].to_list() == [1, 3]
    kept = frame.filter(pl.col("system").is_null() & pl.col("question").str.starts_with("What"))
    assert kept["id"].to_list() == skipped["id"].to_list()[:1] and kept["row"].to_list() == [0]


def test_history_own_keeps_each_conversation_whole_in_one_shard(tmp_path):
    talks = [
        conv(*[(role, f"{role} {i}.{t}") for t in range(1 + i % 3) for role in ("human", "gpt")])
        for i in range(12)
    ]
    talks.append(talks[0])  # the same conversation twice: one unit
    path = write_jsonl(tmp_path / "d.jsonl", talks)
    settings = DatasetSettings(path, seed=0, turns="all")
    out = tmp_path / "own"
    counts = P.prepare_prompts(settings, "own", 10, str(out / "sel.parquet"), str(out / "skipped.parquet"))
    assert counts["selected"] >= 10 and counts["usable"] == 24
    frames = []
    for k in range(4):
        shard = out / f"shard-{k}.parquet"
        P.write_prompt_shard(str(out / "sel.parquet"), 3 * k, min(3 * k + 3, 10), str(shard))
        frames.append(pl.read_parquet(shard))
    whole = pl.concat(frames)
    assert whole.equals(pl.read_parquet(out / "sel.parquet"))  # no gap, no overlap
    for frame in frames:  # every conversation in a shard has all its turns, in order
        for (row,), turns in frame.group_by(["row"]):
            assert turns["turn"].to_list() == list(range(0, 2 * (1 + row % 3), 2))
    assert whole["id"].n_unique() == whole.height
    assert pl.read_parquet(out / "skipped.parquet")["reason"].to_list() == ["duplicate"]


def test_history_own_blocks_and_shards_cut_no_conversation(tmp_path, monkeypatch):
    """With blocks of 2 shards of 3 questions, block and shard edges fall inside conversations: each
    block's file starts at the next conversation start (the previous block holds that conversation
    whole), and its shards, cut by the rules' block-relative rows, cover the whole order exactly once."""
    monkeypatch.setattr(blocks, "SELECTION_BLOCK_SHARDS", 2)
    talks = [
        conv(*[(role, f"{role} {i}.{t}") for t in range(1 + i % 3) for role in ("human", "gpt")])
        for i in range(20)
    ]
    path = write_jsonl(tmp_path / "d.jsonl", talks)
    settings = DatasetSettings(path, seed=0, turns="all")
    size, total = 3, 30
    whole = tmp_path / "whole.parquet"
    P.prepare_prompts(settings, "own", total, str(whole), str(tmp_path / "skipped.parquet"))
    frames = []
    for block in range(-(-total // (2 * size))):  # as rules/prompts.smk: rows [b * 6, (b + 1) * 6)
        start, stop = blocks.selection_block_rows(block, size)
        block_path = tmp_path / f"selection-{block}.parquet"
        P.prepare_prompts(
            settings, "own", stop, str(block_path), str(tmp_path / f"skipped-{block}.parquet"), start
        )
        for k in range(2 * block, 2 * block + 2):  # as get_prompt_shard_rows: relative to the block
            shard = tmp_path / f"shard-{k}.parquet"
            P.write_prompt_shard(
                str(block_path), k * size - start, min(k * size + size, total) - start, str(shard)
            )
            frames.append(pl.read_parquet(shard))
    assert pl.concat(frames).equals(pl.read_parquet(whole))  # no gap, no overlap, same order
    for frame in frames:
        for (row,), turns in frame.group_by(["row"]):
            assert turns["turn"].to_list() == list(range(0, 2 * (1 + row % 3), 2))


def test_a_prompt_shard_is_cut_from_its_selection_block_by_block_relative_rows():
    size, n = 10, blocks.SELECTION_BLOCK_SHARDS
    assert blocks.selection_block(0) == blocks.selection_block(n - 1) == 0 and blocks.selection_block(n) == 1
    assert blocks.prompt_shard_rows(0, size, 1000) == (0, 10)
    assert blocks.prompt_shard_rows(n + 2, size, 10_000) == (20, 30)  # block 1 starts at question 640
    assert blocks.prompt_shard_rows(n + 2, size, n * size + 25) == (20, 25)  # the last shard, short
