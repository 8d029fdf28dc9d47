"""Packed shards: the packing writer (PackedShardFile, as packing.write_shard fills it) and the
memory-mapped reader round-trip, validation, empty shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3_pipeline.hidden_states import storage
from eagle3_pipeline.hidden_states.storage import HiddenStateShard, PackedShardFile, ShardError

H = 8


def samples(lengths):
    g = torch.Generator().manual_seed(0)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, 100, (n,), generator=g, dtype=torch.int32)
        mask = (torch.arange(n) >= n // 3).to(torch.uint8)
        aux = torch.randn(n, 3 * H, generator=g).to(torch.bfloat16)
        final = torch.randn(n, H, generator=g).to(torch.bfloat16)
        out.append(
            {
                "id": f"s{i}",
                "input_ids": ids,
                "loss_mask": mask,
                "aux_hidden_states": aux,
                "final_hidden_states": final,
            }
        )
    return out


def write(path: Path, data, **extra) -> Path:
    """`data`'s samples packed as packing.write_shard does: each sample's rows written in place (here
    the last sample first: a part's rows land wherever its samples sit), then closed with the ids."""
    meta = {"ids": [d["id"] for d in data], "hidden_size": H, "final_state": "post_norm", **extra}
    encoded = storage.encode_metadata(meta)
    shard = PackedShardFile(path, [len(d["input_ids"]) for d in data], H, torch.bfloat16, encoded)
    starts = [sum(len(d["input_ids"]) for d in data[:i]) for i in range(len(data))]
    for start, d in reversed(list(zip(starts, data, strict=True))):
        for name in ("aux_hidden_states", "final_hidden_states"):
            shard.write_rows(name, start, d[name])
    ids = torch.cat([d["input_ids"] for d in data]) if data else torch.zeros(0, dtype=torch.int32)
    mask = torch.cat([d["loss_mask"] for d in data]) if data else torch.zeros(0, dtype=torch.uint8)
    shard.close(encoded, ids, mask)
    return path


def test_round_trip_through_the_reader(tmp_path):
    data = samples([5, 1, 12, 7])
    path = write(tmp_path / "shard-00000.safetensors", data)
    with HiddenStateShard(path) as shard:
        assert len(shard) == 4 and shard.num_tokens == 25
        assert (
            shard.metadata["ids"] == ["s0", "s1", "s2", "s3"] and shard.metadata["final_state"] == "post_norm"
        )
        for want, got in zip(data, shard, strict=True):
            assert set(got) == set(storage.TENSORS)
            for name in storage.TENSORS:
                assert torch.equal(got[name], want[name]), name
        assert torch.equal(shard[-1]["input_ids"], data[-1]["input_ids"])
        with pytest.raises(IndexError):
            shard[4]


def test_file_follows_the_contract(tmp_path):
    data = samples([3, 4])
    path = write(tmp_path / "s.safetensors", data)
    tensors = load_file(str(path))  # the stock loader reads our packed file
    assert {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()} == {
        "input_ids": (torch.int32, (7,)),
        "loss_mask": (torch.uint8, (7,)),
        "aux_hidden_states": (torch.bfloat16, (7, 3 * H)),
        "final_hidden_states": (torch.bfloat16, (7, H)),
        "offsets": (torch.int64, (3,)),
    }
    assert tensors["offsets"].tolist() == [0, 3, 7]
    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()["hidden_size"]) == H


def test_empty_shard_has_zero_rows_and_right_trailing_shapes(tmp_path):
    path = write(tmp_path / "empty.safetensors", [])
    tensors = load_file(str(path))
    assert tuple(tensors["aux_hidden_states"].shape) == (0, 3 * H)
    assert tuple(tensors["final_hidden_states"].shape) == (0, H)
    assert tensors["offsets"].tolist() == [0]
    with HiddenStateShard(path) as shard:
        assert len(shard) == 0 and list(shard) == []
    storage.validate_shard(path, [], [], H)


def test_validation_catches_wrong_ids_shapes_and_nan(tmp_path):
    data = samples([4, 6])
    path = write(tmp_path / "s.safetensors", data)
    ids = [d["input_ids"].tolist() for d in data]
    storage.validate_shard(path, ["s0", "s1"], ids, H)
    with pytest.raises(ShardError, match="sample ids"):
        storage.validate_shard(path, ["s1", "s0"], ids, H)
    with pytest.raises(ShardError, match="input_ids"):
        storage.validate_shard(path, ["s0", "s1"], [ids[0], [t + 1 for t in ids[1]]], H)
    with pytest.raises(ShardError, match="shape"):
        storage.validate_shard(path, ["s0", "s1"], ids, 2 * H)
    data[1]["final_hidden_states"][2, 3] = float("nan")
    path = write(tmp_path / "nan.safetensors", data)
    with pytest.raises(ShardError, match="NaN"):
        storage.validate_shard(path, ["s0", "s1"], ids, H)


def test_not_a_shard_is_refused(tmp_path):
    save_file({"x": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ShardError, match="not a hidden-state shard"):
        HiddenStateShard(tmp_path / "x.safetensors")


def test_reader_expands_final_rows_stored_under_the_loss_mask_only(tmp_path):
    data = samples([5, 6])
    mask = torch.cat([d["loss_mask"] for d in data]).bool()
    tensors = {
        "input_ids": torch.cat([d["input_ids"] for d in data]),
        "loss_mask": mask.to(torch.uint8),
        "aux_hidden_states": torch.cat([d["aux_hidden_states"] for d in data]),
        "final_hidden_states": torch.cat([d["final_hidden_states"] for d in data])[mask],
        "offsets": torch.tensor([0, 5, 11]),
    }
    meta = storage.encode_metadata({"ids": ["s0", "s1"], "final_rows": "loss_mask"})
    save_file(tensors, str(tmp_path / "c.safetensors"), metadata=meta)
    with HiddenStateShard(tmp_path / "c.safetensors") as shard:
        for want, got in zip(data, shard, strict=True):
            m = want["loss_mask"].bool()
            assert torch.equal(got["final_hidden_states"][m], want["final_hidden_states"][m])
            assert not got["final_hidden_states"][~m].any()
