"""The suite's fitted demo target, shipped under tests/data/demo-target/ so that a fresh checkout does not
fit it (TEST_FIT's 290 steps cost 530 CPU seconds, 19 minutes of wall time beside the other worker).

`key` names what the weights depend on (the sample, the fit's code, TEST_DEMO and TEST_FIT); the shipped
copy is used only when its key.txt matches it, and a stale copy fails
tests/unit/test_suite_demo_target_data.py with the command that refits it. The builder rule itself runs
for real in tests/workflow/test_demo_target_rule.py (a 2-second fit), and `make demo` fits its own.

After a deliberate change to the demo's sample or fit code, refit and commit the result:

    cd tests && ../.venv/bin/python -m support.demo_target_data

The weights are shipped as safetensors shards of at most 4 MB with their index (the repository keeps
files under 5 MB) and joined into one model.safetensors when installed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "tests" / "data" / "demo-target"
SAMPLE = REPO / "config" / "demo" / "sample.jsonl"
UNIT_TEMPLATE = REPO / "config" / "demo" / "vllm-demo.service.in"
# the code that decides the weights: the model's shape, the tokenizer, the examples and the fit
FIT_SOURCES = tuple(
    REPO / "src" / "eagle3_pipeline" / "demo" / name
    for name in ("fit.py", "tokenizer.py", "target.py", "maths.py")
)
REGENERATE = "cd tests && ../.venv/bin/python -m support.demo_target_data"
WEIGHTS_INDEX = "model.safetensors.index.json"
MAX_SHARD = "4MB"


def key(demo: object, fit: object) -> str:
    """What the fitted weights depend on, hashed: the sample, FIT_SOURCES and the settings' reprs."""
    digest = hashlib.sha256(SAMPLE.read_bytes())
    for source in FIT_SOURCES:
        digest.update(source.read_bytes())
    digest.update(repr((demo, fit)).encode())
    return digest.hexdigest()[:12]


def shipped_key() -> str | None:
    path = SHIPPED / "key.txt"
    return path.read_text().strip() if path.exists() else None


def has_weights(target: Path) -> bool:
    """A target folder holds its weights: one model.safetensors or an index of shards."""
    return (target / "model.safetensors").exists() or (target / WEIGHTS_INDEX).exists()


def install_shipped(target_dir: Path, wanted_key: str) -> bool:
    """Copy the shipped target into `target_dir` when its key is `wanted_key`, its shards joined into one
    model.safetensors as the demo's builder writes it (rule build_demo_target's output, so that a
    workflow test given this target has nothing to refit); False when it is stale."""
    from safetensors.torch import load_file, save_file

    shipped = SHIPPED / "target"
    if shipped_key() != wanted_key or not has_weights(shipped):
        return False
    work = Path(tempfile.mkdtemp(prefix=".shipped.", dir=target_dir.parent))
    shutil.copytree(shipped, work / "target", ignore=shutil.ignore_patterns("model*.safetensors*"))
    tensors: dict = {}
    for shard in sorted(set(json.loads((shipped / WEIGHTS_INDEX).read_text())["weight_map"].values())):
        tensors.update(load_file(shipped / shard))
    save_file(tensors, work / "target" / "model.safetensors", metadata={"format": "pt"})
    (work / "target").rename(target_dir)  # whole or not at all: a killed copy leaves no target
    shutil.rmtree(work, ignore_errors=True)
    return True


def shard_weights(target: Path) -> None:
    """Rewrite target/model.safetensors as shards of at most MAX_SHARD plus their index, same tensors."""
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    single = target / "model.safetensors"
    save_torch_state_dict(load_file(single), target, max_shard_size=MAX_SHARD, metadata={"format": "pt"})
    single.unlink(missing_ok=True)  # save_torch_state_dict already removes stale weight files


def main() -> None:
    from support.vllm_server import TEST_DEMO, TEST_FIT

    from eagle3_pipeline.demo.target import build_demo_target

    with tempfile.TemporaryDirectory() as scratch:
        build_demo_target(
            SAMPLE, UNIT_TEMPLATE, Path(scratch) / "target", Path(scratch) / "unit.service",
            TEST_DEMO, TEST_FIT, repo=REPO,
        )  # fmt: skip
        shard_weights(Path(scratch) / "target")
        shutil.rmtree(SHIPPED, ignore_errors=True)
        SHIPPED.mkdir(parents=True)
        shutil.copytree(Path(scratch) / "target", SHIPPED / "target")
    (SHIPPED / "key.txt").write_text(key(TEST_DEMO, TEST_FIT) + "\n")
    sys.stdout.write(f"refitted: {SHIPPED} (key {shipped_key()}); commit it\n")


if __name__ == "__main__":
    main()
