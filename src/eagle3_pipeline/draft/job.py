"""A training job: what one run of draft training reads and writes, and its job file.

The rules train_draft and train_draft_window run a thin script (scripts/train_draft.py,
scripts/train_draft_window.py) that builds a `TrainJob` from the rule's inputs, params and outputs
(`rule_job`), writes it as JSON under the job's work folder (`write_job`) and has
eagle3_pipeline.launch exec `accelerate launch -m eagle3_pipeline.draft JOB.json`; every process reads
the file back (`read_job`) as typed settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from eagle3_pipeline import launch
from eagle3_pipeline.settings import (
    DRAFT_ATTENTION_KEYS,
    DRAFT_NORM_KEYS,
    TRAIN_RUNTIME_KEYS,
    DraftSettings,
    TrainSettings,
    section,
)

SectionT = TypeVar("SectionT", DraftSettings, TrainSettings)


@dataclass
class TrainJob:
    """Everything one training run reads and writes (the rule's inputs, params and outputs)."""

    train_shards: list[str]
    validation_shards: list[str]
    vocab_map: str
    target: str  # the target model folder
    draft: DraftSettings
    train: TrainSettings
    work: str
    weights: str  # output: trained tensors
    history: str  # output: per-epoch metrics
    stop_after_steps: int | None = None  # stop (state saved) after this many steps: an interruption
    cpu_threads: int = 0  # torch threads on CPU (0: torch's default); see docs/training.md
    window: WindowJob | None = None  # one window of one epoch (hidden_states.max_disk_gb), else all
    # validate.select_every_epochs: the epochs whose weights are kept (under work/, then as `checkpoints`)
    checkpoint_epochs: list[int] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)  # outputs: the kept epochs' weights, in order


@dataclass
class WindowJob:
    """Which window of which epoch a windowed job trains, and the state files around it."""

    epoch: int
    window: int
    windows: int  # windows per epoch
    plan: str  # draft/windows/plan.json: shards and batches per (epoch, window) (the schedule's length)
    previous: str | None  # the previous (epoch, window)'s state file; None for the first
    state: str  # output: this (epoch, window)'s state file
    shards: list[str]  # the window's shard ids, as the rules assigned them (checked against the plan)


def draft_shape(draft: DraftSettings) -> dict[str, Any]:
    """The draft.* keys draft_config.draft_config_from_target takes (the attention's shape, the norms,
    the architecture)."""
    shape = {key: getattr(draft, key) for key in DRAFT_ATTENTION_KEYS + DRAFT_NORM_KEYS}
    return shape | {"architecture": draft.architecture}


def draft_identity(draft: DraftSettings) -> dict[str, Any]:
    """The draft.* a trained draft depends on, as the resume fingerprint reads them: the shape keys only
    when set (the norms only when on: a draft without them keeps the fingerprint it had before them)."""
    identity: dict[str, Any] = {"ttt_steps": draft.ttt_steps, "step_weight_decay": draft.step_weight_decay}
    identity |= {key: getattr(draft, key) for key in DRAFT_ATTENTION_KEYS if getattr(draft, key) is not None}
    identity |= {"architecture": draft.architecture} if draft.architecture != "auto" else {}  # as the norms
    return identity | {key: True for key in DRAFT_NORM_KEYS if getattr(draft, key)}


def train_identity(train: TrainSettings) -> dict[str, Any]:
    """The train.* a trained draft depends on (TRAIN_RUNTIME_KEYS left out), for the resume fingerprint."""
    return {key: value for key, value in asdict(train).items() if key not in TRAIN_RUNTIME_KEYS}


def _floats(settings: SectionT) -> SectionT:
    """`settings` with its float fields as floats: the schema takes `0` for one (train.weight_decay), and
    the job file, read back and fingerprinted, must not depend on how the config spelled the number."""
    floats = [f.name for f in dataclasses.fields(settings) if f.type == "float"]
    return dataclasses.replace(settings, **{name: float(getattr(settings, name)) for name in floats})


def rule_job(
    train_states: Sequence[str],
    validation_states: Sequence[str],
    vocab_map: str,
    target_config: str,
    draft: DraftSettings,
    train: TrainSettings,
    work: str,
    cpu_threads: int,
    weights: str = "",
    history: str = "",
    window: WindowJob | None = None,
    checkpoint_epochs: Sequence[int] = (),
    checkpoints: Sequence[str] = (),
) -> TrainJob:
    """The job of a train_draft (weights, history) or train_draft_window (window) rule.

    Args:
        train_states: hidden_states/train/shard-*.safetensors, in the rule's order.
        validation_states: hidden_states/validation/shard-*.safetensors (none for a learning-curve point).
        vocab_map: draft/vocab_map.safetensors.
        target_config: The target's config.json (the target is its folder).
        draft: Config draft.*.
        train: Config train.*.
        work: The training state's folder (resume).
        cpu_threads: torch threads on CPU (the rule's threads).
        weights: Output: the trained tensors (train_draft).
        history: Output: the per-epoch metrics (train_draft).
        window: The window of one epoch (train_draft_window).
        checkpoint_epochs: The epochs whose weights are kept (validate.select_every_epochs).
        checkpoints: Outputs: their weights (train_draft).
    """
    if not train_states:
        raise ValueError("a training job needs hidden states of the train split; none given")
    return TrainJob(
        train_shards=[str(p) for p in train_states],
        validation_shards=[str(p) for p in validation_states],
        vocab_map=str(vocab_map),
        target=str(Path(target_config).parent),
        draft=_floats(draft),
        train=_floats(train),
        work=str(work),
        weights=str(weights),
        history=str(history),
        cpu_threads=int(cpu_threads),
        window=window,
        checkpoint_epochs=[int(e) for e in checkpoint_epochs],
        checkpoints=[str(p) for p in checkpoints],
    )


def write_job(job: TrainJob, path: str | Path) -> Path:
    """The job as a job file (JSON) at `path`."""
    return launch.write_job(asdict(job), path)


def read_job(path: str | Path) -> TrainJob:
    """The `TrainJob` a job file holds.

    Raises:
        ValueError: the file is not a training job (a key missing or unknown).
    """
    data = launch.read_job(path)
    window = data.pop("window", None)
    try:
        draft, train = section(DraftSettings, data.pop("draft")), section(TrainSettings, data.pop("train"))
        return TrainJob(**data, draft=draft, train=train, window=WindowJob(**window) if window else None)
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a training job file: {err}") from err


def single_path(value: str | Sequence[str]) -> str | None:
    """A named input that Snakemake hands over as a path or as a list of at most one (an input
    function's list, `rules.x.output`): the path, or None for an empty list."""
    if isinstance(value, str):
        return value or None
    paths = list(value)
    if len(paths) > 1:
        raise ValueError(f"expected at most one path, got {paths}")
    return str(paths[0]) if paths else None
