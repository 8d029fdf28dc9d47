"""The draft stage on shards written by the real hidden-state extraction (not the draft tests' own
writer): vocab map, training and export read exactly what extract_hidden_states writes."""

from __future__ import annotations

import json
from pathlib import Path

from support.hidden_states import trace_rows, write_traces

from eagle3_pipeline.draft.export import export_checkpoint
from eagle3_pipeline.draft.train import TrainJob, main
from eagle3_pipeline.draft.vocab import build_vocab_map
from eagle3_pipeline.hidden_states import extract
from eagle3_pipeline.hidden_states.job import ShardJob
from eagle3_pipeline.settings import DraftSettings, HiddenStatesSettings, TrainSettings


def extracted(traces: Path, target: Path, out: Path) -> Path:
    job = ShardJob(traces=traces, shard=0, target=target, work=out / "work",
                   output=out / "shard-00000.safetensors", metadata=out / "shard-00000.json")  # fmt: skip
    hidden_states = HiddenStatesSettings(backend="transformers", batch_tokens=400, compute_dtype="float32")
    extract.extract_shards(hidden_states, [job])
    return job.output


def test_draft_stage_reads_what_extraction_writes(hs_target, hs_tokenizer, tmp_path):
    root = tmp_path / "hidden_states"
    train_traces = write_traces(tmp_path / "train.parquet", trace_rows(hs_tokenizer, 6, shard=0))
    validation_traces = write_traces(
        tmp_path / "validation.parquet", trace_rows(hs_tokenizer, 2, shard=0, start=6)
    )
    train = extracted(train_traces, hs_target, root / "train")
    validation = extracted(validation_traces, hs_target, root / "validation")
    meta = json.loads(train.with_suffix(".json").read_text())
    # the whole vocabulary: every row whose token is completion text counts, whichever target is used
    build_vocab_map([train.with_suffix(".json")], meta["vocab_size"], 32000, tmp_path / "vocab.safetensors")
    job = TrainJob(
        train_shards=[str(train)],
        validation_shards=[str(validation)],
        vocab_map=str(tmp_path / "vocab.safetensors"),
        target=str(hs_target),
        draft=DraftSettings(ttt_steps=2, step_weight_decay=0.8),
        train=TrainSettings(epochs=1, lr=1e-3, warmup_ratio=0.1, weight_decay=0.0, grad_clip=0.5,
                            batch_tokens=512, seed=0, save_every_steps=100),
        work=str(tmp_path / "work"),
        weights=str(tmp_path / "trained" / "model.safetensors"),
        history=str(tmp_path / "trained" / "history.json"),
    )  # fmt: skip
    assert main(job)
    history = json.loads(Path(job.history).read_text())
    assert history[0]["train"]["tokens"] > 0 and history[0]["validation"]["tokens"] > 0
    out = tmp_path / "checkpoint"
    export_checkpoint(job.weights, job.vocab_map, hs_target / "config.json", train.with_suffix(".json"),
                      out / "config.json", out / "model.safetensors")  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    # 8 layers: vLLM's numbering at the top level, SGLang's (0-indexed outputs) under eagle_config
    assert config["eagle_aux_hidden_state_layer_ids"] == meta["aux_layers_vllm"] == [2, 4, 5]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == meta["aux_layers"] == [1, 3, 4]
