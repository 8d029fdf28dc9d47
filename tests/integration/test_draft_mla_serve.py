"""An MLA draft (draft.architecture auto on a DeepseekV3 target) trained by our code, exported, and served
by the real vLLM CPU build as Eagle3DeepseekV3ForCausalLM beside its MLA target.

vLLM's CPU build serves an MLA draft only beside an MLA target (beside the Llama demo target: "ValueError:
No common block size for 128 (CPU_ATTN: [MultipleOf(32)]; CPU_MLA: [16])"), so the target is a tiny random
DeepseekV3 built offline (tests/support/mla_target.py: MLA with YaRN rope, noaux_tc routed + shared
experts). The draft is trained on hidden states of the target's own greedy continuations (transformers),
its offline replay measured on held-out prompts (validate/offline.py), and the same prompts served
greedily: vLLM must load the draft's class, count drafts in /metrics, and its acceptance must agree with
the replay (within the two engines' feature differences on MoE/MLA targets). One vLLM server.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import requests
import torch
from support.mla_target import greedy_sequences, load_target, write_mla_target, write_shard
from support.requirements import require
from support.vllm_server import VllmServer, cpu_vllm_env, draft_server_command

from eagle3_pipeline.draft.export import MLA_ARCHITECTURE, SPECULATORS_REFUSAL, export_checkpoint
from eagle3_pipeline.draft.train import TrainJob, main
from eagle3_pipeline.draft.vocab import build_vocab_map
from eagle3_pipeline.ports import free_port
from eagle3_pipeline.settings import DraftSettings, TrainSettings
from eagle3_pipeline.validate.offline import evaluate

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
# the vLLM metrics read here (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("literal", "vllm/v1/spec_decode/metrics.py", "vllm:spec_decode_num_drafts"),
    ("literal", "vllm/v1/spec_decode/metrics.py", "vllm:spec_decode_num_accepted_tokens"),
)

PROMPT_LEN, NEW_TOKENS, STEPS = 8, 24, 3
# the draft learns the few sequences it is then served on (about 40 steps): acceptance well above 1 in
# both engines, so that the comparison measures something
TRAIN = TrainSettings(epochs=20, lr=3e-3, warmup_ratio=0.1, batch_tokens=96, seed=0, save_every_steps=1000)
# served acceptance against the served run replayed offline on the served text itself (transformers'
# states of vLLM's own greedy continuations, which drift from transformers' greedy ones in bf16): the
# engines' features still differ by a few percent on MoE/MLA targets, so some anchors flip
TOLERANCE = 0.5


class MlaServer(VllmServer):
    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(8, vocab, (PROMPT_LEN,), generator=generator).tolist() for _ in range(count)]


def trained_mla_draft(root: Path) -> tuple[Path, Path, list[list[int]], list[list[int]]]:
    """(target, exported checkpoint, the prompts, their transformers greedy sequences): trained, replayed
    and served on the same few sequences."""
    target = write_mla_target(root / "target")
    model = load_target(target)
    vocab = model.config.vocab_size
    val_prompts = prompts(4, vocab, seed=1)
    val_seqs = greedy_sequences(model, val_prompts, NEW_TOKENS)
    train_shard = write_shard(model, val_seqs, PROMPT_LEN, root / "hs" / "train" / "shard-00000.safetensors")
    val_shard = write_shard(
        model, val_seqs, PROMPT_LEN, root / "hs" / "validation" / "shard-00000.safetensors"
    )
    metadata = train_shard.with_suffix(".json")
    build_vocab_map([metadata], vocab, 256, root / "vocab_map.safetensors")
    job = TrainJob(
        train_shards=[str(train_shard)],
        validation_shards=[str(val_shard)],
        vocab_map=str(root / "vocab_map.safetensors"),
        target=str(target),
        draft=DraftSettings(ttt_steps=STEPS, draft_vocab_size=256),  # architecture auto: MLA here
        train=TRAIN,
        work=str(root / "work"),
        weights=str(root / "trained" / "model.safetensors"),
        history=str(root / "trained" / "history.json"),
        cpu_threads=1,
    )
    assert main(job)
    checkpoint = root / "checkpoint"
    export_checkpoint(
        job.weights,
        job.vocab_map,
        target / "config.json",
        metadata,
        checkpoint / "config.json",
        checkpoint / "model.safetensors",
        speculators_dir=root / "speculators",
    )
    return target, checkpoint, val_prompts, val_seqs


def start(target: Path, draft: Path, log: Path) -> MlaServer:
    port = free_port()
    command = [*draft_server_command(target, draft, port, 256, STEPS), "--max-num-seqs", "4"]
    env = os.environ | cpu_vllm_env() | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return MlaServer(command, env, port, log, str(target)).start()


def counter(metrics: str, name: str) -> float:
    lines = [line for line in metrics.splitlines() if line.startswith(name) and not line.startswith("#")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.split("{")[0].split(" ")[0] == name)


def test_an_mla_draft_trained_here_is_served_by_vllm_and_matches_its_replay(tmp_path):
    require("vllm")
    torch.set_num_threads(1)
    target, checkpoint, val_prompts, val_seqs = trained_mla_draft(tmp_path)
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == [MLA_ARCHITECTURE] and config["model_type"] == "deepseek_v2"
    assert json.loads((tmp_path / "speculators" / "config.json").read_text())["error"] == SPECULATORS_REFUSAL
    shard = tmp_path / "hs" / "validation" / "shard-00000.safetensors"
    offline = evaluate(checkpoint, target, [shard], steps=STEPS, device="cpu")
    replayed = offline["acceptance_length"][-1]

    server = start(target, checkpoint, tmp_path / "vllm.log")
    try:
        served_tokens = []
        for prompt in val_prompts:
            body = {"model": str(target), "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0}
            body |= {"ignore_eos": True, "return_token_ids": True}
            response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=300)
            assert response.status_code == 200, response.text
            served_tokens.append(response.json()["choices"][0].get("token_ids"))
        metrics = requests.get(f"{server.base_url}/metrics", timeout=10).text
    finally:
        server.stop()
    log = (tmp_path / "vllm.log").read_text(errors="replace")
    assert MLA_ARCHITECTURE in log, log[-3000:]
    assert "Using auxiliary layers from speculative config: (1, 2, 3)" in log, log[-3000:]
    drafts = counter(metrics, "vllm:spec_decode_num_drafts_total")
    accepted = counter(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0, f"no drafts counted:\n{log[-3000:]}"
    served = 1 + accepted / drafts
    same = sum(s == v[PROMPT_LEN:] for s, v in zip(served_tokens, val_seqs, strict=True))
    served_seqs = [p + s for p, s in zip(val_prompts, served_tokens, strict=True)]
    served_shard = write_shard(load_target(target), served_seqs, PROMPT_LEN, tmp_path / "served.safetensors")
    # the served run replayed (drafts only where vLLM drafts, after each verification step: what a served
    # figure is compared with; every-position acceptance reads higher), greedy, with its interval
    greedy = evaluate(checkpoint, target, [served_shard], steps=STEPS, device="cpu")["replayed"]["greedy"]
    replay, (low, high) = greedy["acceptance_length"][-1], greedy["ci95"][-1]
    figures = f"served {served:.3f}, its text replayed {replay:.3f} [{low}, {high}], every position of the "
    figures += f"training text {replayed:.3f}; continuations equal to transformers' greedy: {same}/4"
    logging.getLogger(__name__).info(figures)  # -o log_cli=true --log-cli-level=INFO shows it
    assert replayed > 1.5, figures  # the draft learnt its sequences
    assert low <= served <= high and abs(served - replay) <= TOLERANCE, figures
