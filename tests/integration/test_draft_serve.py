"""The exported draft loads in the real vLLM CPU server as an EAGLE-3 draft of the target and drafts.

Hidden states come from running the target (the demo target when built, else the hidden-state tests'
tiny servable Llama) over random sequences; the draft is trained briefly, exported, and served with
`--speculative-config '{"method": "eagle3", ...}'`; /metrics must then count drafts. Here a draft whose
vocabulary is the whole of the target's (no d2t in the checkpoint); a smaller vocabulary (d2t) and
non-default layers are served, with the same checks, by tests/integration/test_serve_check.py's drafts
(trained on the demo target's greedy replies, served by the rule's own entry).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from support.draft import write_hidden_states
from support.vllm_server import draft_server_command

from eagle3_pipeline.draft.export import export_checkpoint
from eagle3_pipeline.draft.train import TrainJob, main
from eagle3_pipeline.draft.vocab import build_vocab_map
from eagle3_pipeline.settings import DraftSettings, TrainSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
# the vLLM metrics read here (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("literal", "vllm/v1/spec_decode/metrics.py", "vllm:spec_decode_num_drafts"),
    ("literal", "vllm/v1/spec_decode/metrics.py", "vllm:spec_decode_num_draft_tokens"),
)

TRAIN = {
    "epochs": 1,
    "lr": 1e-3,
    "warmup_ratio": 0.1,
    "weight_decay": 0.0,
    "grad_clip": 0.5,
    "batch_tokens": 512,
    "seed": 0,
    "save_every_steps": 100,
}


def exported_draft(target: Path, root: Path, draft_vocab_size: int, layers: list[int] | None = None) -> Path:
    """Shards (of `layers`, 0-indexed outputs; default EAGLE-3's) -> vocab map -> a short training ->
    the exported checkpoint folder."""
    shards = write_hidden_states(target, root / "hidden_states", train=8, validation=2, layers=layers)
    vocab_size = json.loads((target / "config.json").read_text())["vocab_size"]
    metadata = [p.with_suffix(".json") for p in shards["train"]]
    build_vocab_map(metadata, vocab_size, draft_vocab_size, root / "vocab_map.safetensors")
    job = TrainJob(
        train_shards=[str(p) for p in shards["train"]],
        validation_shards=[str(p) for p in shards["validation"]],
        vocab_map=str(root / "vocab_map.safetensors"),
        target=str(target),
        draft=DraftSettings(ttt_steps=2, step_weight_decay=0.8),
        train=TrainSettings(**TRAIN),
        work=str(root / "work"),
        weights=str(root / "trained" / "model.safetensors"),
        history=str(root / "trained" / "history.json"),
    )
    assert main(job)
    checkpoint = root / "checkpoint"
    export_checkpoint(
        job.weights,
        job.vocab_map,
        target / "config.json",
        metadata[0],
        checkpoint / "config.json",
        checkpoint / "model.safetensors",
    )
    return checkpoint


def start_server(target: Path, draft: Path, port: int, log: Path) -> subprocess.Popen:
    max_len = min(1024, json.loads((target / "config.json").read_text()).get("max_position_embeddings", 1024))
    command = draft_server_command(target, draft, port, max_len)
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.Popen(
        command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_healthy(process: subprocess.Popen, base_url: str, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"vLLM exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if requests.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(2)
    pytest.fail(f"vLLM not healthy after {timeout_s} s:\n{log.read_text()[-4000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def counter(metrics: str, name: str) -> float:
    values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", metrics, flags=re.MULTILINE)
    return sum(float(v) for v in values)


@pytest.mark.parametrize(("draft_vocab_size", "layers", "port"), [(32000, None, 18561)], ids=["full-vocab"])
def test_exported_draft_serves_as_eagle3_in_vllm(servable_target, tmp_path, draft_vocab_size, layers, port):
    checkpoint = exported_draft(Path(servable_target), tmp_path, draft_vocab_size, layers)
    log = tmp_path / "vllm.log"
    process = start_server(Path(servable_target), checkpoint, port, log)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, base_url, log)
        model = requests.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        for prompt in ["What is 12 + 30?", "Sort the list 3, 1, 2."]:
            body = {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0.0}
            response = requests.post(f"{base_url}/v1/completions", json=body, timeout=300)
            assert response.status_code == 200, response.text
        metrics = requests.get(f"{base_url}/metrics", timeout=10).text
        drafts = counter(metrics, "vllm:spec_decode_num_drafts_total")
        assert drafts > 0, f"no drafts counted; log tail:\n{log.read_text()[-3000:]}"
        assert counter(metrics, "vllm:spec_decode_num_draft_tokens_total") >= 3 * drafts
        # vLLM's runner logs the layers it captures for the draft: the trained ones, in its numbering
        expected = tuple(i + 1 for i in layers) if layers else (2, 4, 5)  # the 8-layer target's default
        assert f"Using auxiliary layers from speculative config: {expected}" in log.read_text()
    finally:
        stop(process)
