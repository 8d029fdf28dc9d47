"""Fixtures for the draft tests: a tiny random Llama target and hidden-state shards made by running it
over random token sequences, written in the hidden-state stage's format (storage.py's layout and
metadata), so that the draft code reads exactly what extraction writes.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3_pipeline.draft.export import export_checkpoint
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.train import TrainJob
from eagle3_pipeline.draft.vocab import build_vocab_map
from eagle3_pipeline.draft_config import draft_config_from_target, read_target_config
from eagle3_pipeline.hidden_states.storage import encode_metadata
from eagle3_pipeline.settings import DraftSettings, TrainSettings

DEMO_TARGET = Path(__file__).resolve().parents[2] / "resources" / "demo" / "target"


def build_random_target(directory: Path, vocab_size: int = 96, hidden: int = 64, layers: int = 4) -> Path:
    """A random LlamaForCausalLM saved with save_pretrained (config.json + model.safetensors)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden // 2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default: outputs of decoder layers 1, N/2-1, N-4 (0-indexed)."""
    return [1, num_layers // 2 - 1, num_layers - 4]


@torch.no_grad()
def write_hidden_state_shard(
    target_dir: Path,
    path: Path,
    num_samples: int,
    seed: int,
    length: tuple[int, int] = (12, 40),
    layers: list[int] | None = None,
) -> Path:
    """Run the target over random sequences (first ~third prompt, the rest completion) and write one
    shard and its .json sibling at `path`; `layers` (0-indexed outputs) default to EAGLE-3's."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    config = model.config
    layers = layers or aux_layers(config.num_hidden_layers)
    generator = torch.Generator().manual_seed(seed)
    ids, masks, aux, final = [], [], [], []
    for _ in range(num_samples):
        n = int(torch.randint(length[0], length[1] + 1, (1,), generator=generator))
        tokens = torch.randint(0, config.vocab_size, (1, n), generator=generator)
        mask = torch.zeros(n, dtype=torch.uint8)
        mask[n // 3 :] = 1
        out = model.model(input_ids=tokens, output_hidden_states=True)
        aux.append(torch.cat([out.hidden_states[i + 1][0] for i in layers], dim=-1))
        final.append(out.last_hidden_state[0])  # after the final norm
        ids.append(tokens[0])
        masks.append(mask)
    return save_shard(
        path, config, layers, ids, masks, aux, final, [f"s{seed}-{i}" for i in range(num_samples)]
    )


def save_shard(
    path: Path,
    config: object,
    layers: list[int],
    ids: list[torch.Tensor],
    masks: list[torch.Tensor],
    aux: list[torch.Tensor],
    final: list[torch.Tensor],
    names: list[str],
) -> Path:
    """Per-sequence token ids, loss masks, auxiliary and final states -> one shard in the hidden-state
    stage's format (storage.py's tensors and metadata) at `path`, and its .json sibling."""
    counts = Counter()
    for tokens, mask in zip(ids, masks, strict=True):
        counts.update(tokens[mask.bool()].tolist())
    lengths = [len(t) for t in ids]
    meta = {
        "ids": names,
        "num_samples": len(ids),
        "num_tokens": sum(lengths),
        "num_loss_tokens": int(sum(m.sum() for m in masks)),
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "vocab_size": config.vocab_size,
        "aux_layers": layers,
        "aux_layers_vllm": [i + 1 for i in layers],
        "final_state": "post_norm",
        "token_counts": {str(k): v for k, v in sorted(counts.items())},
    }
    tensors = {
        "input_ids": torch.cat(ids).to(torch.int32),
        "loss_mask": torch.cat(masks),
        "aux_hidden_states": torch.cat(aux).to(torch.bfloat16),
        "final_hidden_states": torch.cat(final).to(torch.bfloat16),
        "offsets": torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=encode_metadata(meta))
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return path


def write_hidden_states(
    target_dir: Path, root: Path, train: int = 24, validation: int = 6, layers: list[int] | None = None
) -> dict[str, list[Path]]:
    """Train and validation shards under root/{split}/ (two train shards, one validation shard)."""
    half = train // 2
    return {
        "train": [
            write_hidden_state_shard(
                target_dir, root / "train" / "shard-00000.safetensors", half, seed=1, layers=layers
            ),
            write_hidden_state_shard(
                target_dir, root / "train" / "shard-00001.safetensors", train - half, seed=2, layers=layers
            ),
        ],
        "validation": [
            write_hidden_state_shard(
                target_dir, root / "validation" / "shard-00000.safetensors", validation, seed=3, layers=layers
            )
        ],
    }


@pytest.fixture(scope="session")
def random_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_target(tmp_path_factory.mktemp("random_target"))


@pytest.fixture(scope="session")
def draft_hidden_states(
    random_target: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[Path]]:
    return write_hidden_states(random_target, tmp_path_factory.mktemp("hidden_states"))


@pytest.fixture(scope="session")
def servable_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A target vLLM can serve: the demo target when built, else the hidden-state tests' tiny Llama
    (8 layers, head_dim 64, its own tokenizer)."""
    if (DEMO_TARGET / "model.safetensors").exists() and (DEMO_TARGET / "tokenizer.json").exists():
        return DEMO_TARGET
    from support.hidden_states import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("servable_target"))


# Export helpers shared by tests/unit/test_draft_export.py and its vLLM half in tests/integration/.
def trained_weights(random_target, draft_vocab_size, path):
    config = draft_config_from_target(read_target_config(random_target), draft_vocab_size)
    tensors = Eagle3Draft(config).exported_state_dict()
    save_file(tensors, str(path), metadata={"draft_config": json.dumps(config.to_dict())})
    return config


LAYER_CASES = [(8, [1, 3, 4]), (8, [0, 2, 6]), (61, [1, 29, 57]), (61, [2, 30, 58])]


def export_with_layers(random_target, tmp_path, outputs: list[int]) -> dict:
    """Export for shards whose metadata says they hold the outputs of `outputs` (0-indexed)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    metadata = tmp_path / "shard-00000.json"
    metadata.write_text(json.dumps({"aux_layers": outputs, "aux_layers_vllm": [i + 1 for i in outputs]}))
    build_vocab_map_for(random_target, tmp_path)
    trained_weights(random_target, 40, tmp_path / "trained.safetensors")
    out = tmp_path / "checkpoint"
    export_checkpoint(
        tmp_path / "trained.safetensors",
        tmp_path / "vocab.safetensors",
        random_target / "config.json",
        metadata,
        out / "config.json",
        out / "model.safetensors",
    )
    return json.loads((out / "config.json").read_text())


def build_vocab_map_for(random_target, tmp_path):
    from eagle3_pipeline.draft.vocab import vocab_map

    d2t, t2d = vocab_map(torch.arange(40), 96)  # the fixture target's vocabulary: 96
    save_file({"d2t": d2t, "t2d": t2d}, str(tmp_path / "vocab.safetensors"))


# The training job of tests/unit/test_draft_train.py and its process-level half in tests/integration/.
TRAIN = TrainSettings(
    epochs=2,
    lr=3e-3,
    warmup_ratio=0.1,
    weight_decay=0.0,
    grad_clip=0.5,
    batch_tokens=256,
    seed=0,
    save_every_steps=100,
)


@pytest.fixture
def draft_train_job(draft_hidden_states, random_target, tmp_path) -> TrainJob:
    vocab = tmp_path / "vocab_map.safetensors"
    build_vocab_map([p.with_suffix(".json") for p in draft_hidden_states["train"]], 96, 64, vocab)
    return TrainJob(
        train_shards=[str(p) for p in draft_hidden_states["train"]],
        validation_shards=[str(p) for p in draft_hidden_states["validation"]],
        vocab_map=str(vocab),
        target=str(random_target),
        draft=DraftSettings(ttt_steps=3, step_weight_decay=0.8),
        train=TRAIN,
        work=str(tmp_path / "work"),
        weights=str(tmp_path / "out" / "model.safetensors"),
        history=str(tmp_path / "out" / "history.json"),
        # torch's thread count is process-wide and earlier tests change it; float sums differ with it
        cpu_threads=1,
    )
