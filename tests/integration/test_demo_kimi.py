"""The Kimi-family demo's cheapest end-to-end slice: its target built offline (a few fit steps: the shape,
the wrapper and the weights' names, not the fit, are checked) and served by the real vLLM CPU build from
the ExecStart of its own unit template, as rule build_demo_target renders it (demo.family kimi).

vLLM must resolve Kimi-K2.5's wrapper (KimiK25ForConditionalGeneration), run the DeepseekV3 text model on
its CPU MLA and MoE backends, and answer a chat request whose prompt, from the thinking template, ends
in <think>. The draft for this target is MLA by draft.architecture auto. The whole demo (every stage to
a served MLA draft and the head-to-head) is `make demo DEMO=kimi` (docs/demo.md).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import requests
from safetensors import safe_open
from support.requirements import require
from support.vllm_server import REPO, SAMPLE, VllmServer

from eagle3_pipeline.demo.fit import FitOptions
from eagle3_pipeline.demo.kimi import KIMI_ARCHITECTURE, KIMI_SERVED_MODEL_NAME, KIMI_TEXT_SHAPE
from eagle3_pipeline.demo.target import build_demo_target, render_unit
from eagle3_pipeline.draft_config import read_target_config, resolve_architecture
from eagle3_pipeline.ports import free_port
from eagle3_pipeline.server.unit import command_argv, merge_unit
from eagle3_pipeline.settings import DemoSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

UNIT_TEMPLATE = REPO / "config" / "demo-kimi" / "vllm-demo-kimi.service.in"
UNIT_NAME = "vllm-demo-kimi.service"
# the wrapper, the routing and the weights are what is checked here; the demo's fit is its CPU budget
FEW_STEPS = FitOptions(steps=2, threads=1)


class KimiServer(VllmServer):
    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def test_kimi_family_target_is_built_and_served_by_vllm(tmp_path: Path) -> None:
    require("vllm")
    target = tmp_path / "target"
    port = free_port()
    demo = DemoSettings(enabled=True, family="kimi", port=port)
    build_demo_target(SAMPLE, UNIT_TEMPLATE, target, tmp_path / UNIT_NAME, demo, FEW_STEPS, repo=REPO)

    config = json.loads((target / "config.json").read_text())
    text = config["text_config"]
    assert config["architectures"] == [KIMI_ARCHITECTURE] and config["model_type"] == "kimi_k25"
    assert text["model_type"] == "deepseek_v3" and text["topk_method"] == "noaux_tc"
    rope = text.get("rope_scaling") or text["rope_parameters"]  # transformers 4's and 5's spellings
    assert rope["type"] == "yarn" and text["n_shared_experts"] == 1
    assert text["kv_lora_rank"] + text["qk_rope_head_dim"] == 576  # vLLM CPU's MLA width
    with safe_open(str(target / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())  # noqa: SIM118 (a handle, not a dict)
    moe_layers = range(KIMI_TEXT_SHAPE["first_k_dense_replace"], KIMI_TEXT_SHAPE["num_hidden_layers"])
    assert {f"language_model.model.layers.{i}.mlp.gate.e_score_correction_bias" for i in moe_layers} <= names
    assert "language_model.model.layers.1.mlp.experts.3.down_proj.weight" in names  # per expert, as Kimi's
    assert all(name.startswith("language_model.") for name in names)
    # draft.architecture auto reads the wrapper's text_config: an MLA draft
    assert resolve_architecture(read_target_config(target)) == "deepseek_mla"

    unit = (tmp_path / UNIT_NAME).read_text()
    assert unit == render_unit(UNIT_TEMPLATE.read_text(), REPO, target, port)
    parsed = merge_unit([(UNIT_NAME, unit)], UNIT_NAME)  # the snapshot's parser
    command = command_argv(parsed.exec_start[-1], parsed.environment, [])
    assert "--language-model-only" in command
    server = KimiServer(
        command, {**os.environ, **parsed.environment}, port, tmp_path / "vllm.log", KIMI_SERVED_MODEL_NAME
    )
    server.start()
    try:
        response = requests.post(
            f"{server.base_url}/v1/chat/completions",
            json={
                "model": KIMI_SERVED_MODEL_NAME,
                "messages": [{"role": "user", "content": "What is 12 + 30?"}],
                "max_tokens": 16,
                "temperature": 0,
                "return_token_ids": True,
            },
            timeout=120,
        )
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    log = server.log_tail(400)
    assert f"Resolved architecture: {KIMI_ARCHITECTURE}" in log, log
    # MLA attention on the CPU build: CPU_MLA, or AMX_MLA where the CPU has AMX (vllm/platforms/cpu.py)
    assert re.search(r"Using (CPU|AMX)_MLA backend", log), log
    think = json.loads((target / "tokenizer.json").read_text())
    think_id = next(t["id"] for t in think["added_tokens"] if t["content"] == "<think>")
    assert body["prompt_token_ids"][-1] == think_id  # the generation prompt opens the thinking block
    assert len(choice["token_ids"]) == 16 or choice["finish_reason"] == "stop", choice
    assert choice["message"].get("reasoning"), choice  # the kimi_k2 parser: thinking until </think>
