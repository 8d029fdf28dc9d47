"""The files of a `draft.init_from` folder, without torch: the rules read them at parse time (their
inputs), where importing torch would cost seconds on every `snakemake` call (draft/init_from.py reads
the draft itself)."""

from __future__ import annotations

from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the first one present is read


def weights_file(path: str | Path) -> Path:
    """The starting draft's weights: model.safetensors, else pytorch_model.bin (as EAGLE's own releases
    ship); model.safetensors when neither exists, so that a missing input names the file the export
    writes."""
    folder = Path(path).expanduser()
    return next((folder / f for f in WEIGHT_FILES if (folder / f).exists()), folder / WEIGHT_FILES[0])


def checkpoint_files(path: str | Path) -> list[str]:
    """The starting draft's files that training reads: the rules' inputs (a new or changed one retrains)."""
    return [str(Path(path).expanduser() / "config.json"), str(weights_file(path))]
