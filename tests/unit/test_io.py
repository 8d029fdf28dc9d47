"""eagle3_pipeline.io: every writer is atomic, cleans up after itself and creates the folder."""

import json

import polars as pl
import pytest
import torch
from safetensors import safe_open

from eagle3_pipeline import io


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_each_format_round_trips_into_a_new_folder(tmp_path):
    folder = tmp_path / "a" / "b"
    io.write_json({"b": 1, "a": [1, 2]}, folder / "x.json", indent=1, sort_keys=True)
    assert (folder / "x.json").read_text() == json.dumps({"a": [1, 2], "b": 1}, indent=1) + "\n"
    io.write_text("héllo\n", folder / "x.txt")
    assert (folder / "x.txt").read_text(encoding="utf-8") == "héllo\n"
    frame = pl.DataFrame({"id": ["a", "b"], "n": [1, 2]})
    io.write_parquet(frame, folder / "x.parquet", compression="zstd", statistics=False)
    assert pl.read_parquet(folder / "x.parquet").equals(frame)
    io.write_safetensors({"w": torch.arange(6).reshape(2, 3).t()}, folder / "x.safetensors", {"k": "v"})
    with safe_open(str(folder / "x.safetensors"), "pt") as f:
        assert f.metadata() == {"k": "v"}
        assert torch.equal(f.get_tensor("w"), torch.arange(6).reshape(2, 3).t())
    io.write_torch({"step": 3, "t": torch.ones(2)}, folder / "state.pt")
    assert torch.load(folder / "state.pt")["step"] == 3
    assert leftovers(folder) == []


def test_deterministic_parquet_is_byte_identical(tmp_path):
    frame = pl.DataFrame({"id": ["a", "b"], "n": [1, 2]})
    for name in ("1.parquet", "2.parquet"):
        io.write_parquet(frame, tmp_path / name, compression="zstd", statistics=False)
    assert (tmp_path / "1.parquet").read_bytes() == (tmp_path / "2.parquet").read_bytes()


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "x.json"
    io.write_json({"v": 1}, path)
    with pytest.raises(TypeError):
        io.write_json({"v": object()}, path)  # not serialisable: fails before anything is committed
    assert json.loads(path.read_text()) == {"v": 1}
    with pytest.raises(RuntimeError), io.atomic_path(path) as tmp:
        tmp.write_text('{"v": 2, "half')  # half a file exists only under the temporary name
        assert json.loads(path.read_text()) == {"v": 1}
        raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"v": 1}
    assert leftovers(tmp_path) == []


def test_a_failed_first_write_leaves_no_destination(tmp_path):
    path = tmp_path / "new" / "x.parquet"
    with pytest.raises(KeyboardInterrupt), io.atomic_path(path) as tmp:
        tmp.write_bytes(b"PAR1 half")
        raise KeyboardInterrupt
    assert not path.exists()
    assert leftovers(path.parent) == []


def test_the_temporary_is_beside_the_destination_and_unique(tmp_path):
    path = tmp_path / "x.json"
    first, second = io.temp_path(path), io.temp_path(path)
    assert first.parent == second.parent == tmp_path and first != second
    assert first.name.startswith(".x.json.") and first.name.endswith(".tmp")
