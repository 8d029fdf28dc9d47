"""A training job: what one run of draft training reads and writes, and its job file.

The rules train_draft and train_draft_window run a thin script (scripts/train_draft.py,
scripts/train_draft_window.py) that builds a `TrainJob` from the rule's inputs, params and outputs
(`rule_job`), writes it as JSON under the job's work folder (`write_job`) and has
eagle3_pipeline.launch exec `accelerate launch -m eagle3_pipeline.draft JOB.json`; every process reads
the file back (`read_job`). The settings are typed here once (the config may hold `3e-3` as a string).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3_pipeline import launch
from eagle3_pipeline.settings import TRAIN_DEFAULTS

# config draft.*: the attention's shape (None: the default) and EAGLE-3.1's norms (false: off)
DRAFT_ATTENTION_KEYS = ("head_dim", "num_attention_heads", "num_key_value_heads")
DRAFT_NORM_KEYS = ("norm_before_fc", "fc_norm", "norm_output")
DRAFT_SHAPE_KEYS = DRAFT_ATTENTION_KEYS + DRAFT_NORM_KEYS  # what draft_config_from_target takes


@dataclass
class TrainJob:
    """Everything one training run reads and writes (the rule's inputs, params and outputs)."""

    train_shards: list[str]
    validation_shards: list[str]
    vocab_map: str
    target: str  # the target model folder
    draft: dict[str, Any]  # config draft.* (ttt_steps, step_weight_decay; the DRAFT_SHAPE_KEYS when set/on)
    train: dict[str, Any]  # config train.*
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


# train.* keys a job reads, typed (RUNTIME_TRAIN_KEYS are left out of the resume fingerprint: train.py)
RUNTIME_TRAIN_KEYS = ("save_every_steps", "activation_checkpointing", "fsdp")
TRAIN_KEYS = {
    "epochs": int,
    "lr": float,
    "warmup_ratio": float,
    "weight_decay": float,
    "grad_clip": float,
    "batch_tokens": int,
    "seed": int,
    "save_every_steps": int,
    "activation_checkpointing": bool,
    "fsdp": bool,
}


def split_shards(paths: list[str]) -> tuple[list[str], list[str]]:
    """(train, validation) shard paths, by their split folder (hidden_states/{split}/shard-*.safetensors)."""
    train = [p for p in paths if Path(p).parent.name == "train"]
    validation = [p for p in paths if Path(p).parent.name == "validation"]
    other = sorted(set(paths) - set(train) - set(validation))
    if other or not train:
        raise ValueError(
            f"hidden-state shards must sit under train/ or validation/ (train: {len(train)}, other: {other})"
        )
    return train, validation


def job_settings(draft: Mapping[str, Any], train: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The draft.* and train.* settings a training job reads, typed; the shape keys only when set.

    Raises:
        KeyError: a setting the job needs is missing from the config section.
    """
    settings = {"ttt_steps": int(draft["ttt_steps"]), "step_weight_decay": float(draft["step_weight_decay"])}
    settings |= {key: int(draft[key]) for key in DRAFT_ATTENTION_KEYS if draft.get(key) is not None}
    # only when on: a draft without them keeps the job (and its resume fingerprint) it had before them
    settings |= {key: True for key in DRAFT_NORM_KEYS if draft.get(key)}
    defaults = {  # newer keys: optional
        "activation_checkpointing": TRAIN_DEFAULTS.activation_checkpointing,
        "fsdp": TRAIN_DEFAULTS.fsdp,
    }
    typed = {key: kind(train[key] if key in train else defaults[key]) for key, kind in TRAIN_KEYS.items()}
    return settings, typed


def rule_job(
    states: Sequence[str],
    vocab_map: str,
    target_config: str,
    draft: Mapping[str, Any],
    train: Mapping[str, Any],
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
        states: hidden_states/{train,validation}/shard-*.safetensors, in the rule's order.
        vocab_map: draft/vocab_map.safetensors.
        target_config: The target's config.json (the target is its folder).
        draft: Config draft.* (see `job_settings`).
        train: Config train.*.
        work: The training state's folder (resume).
        cpu_threads: torch threads on CPU (the rule's threads).
        weights: Output: the trained tensors (train_draft).
        history: Output: the per-epoch metrics (train_draft).
        window: The window of one epoch (train_draft_window).
        checkpoint_epochs: The epochs whose weights are kept (validate.select_every_epochs).
        checkpoints: Outputs: their weights (train_draft).
    """
    train_shards, validation_shards = split_shards(list(states))
    draft_settings, train_settings = job_settings(draft, train)
    return TrainJob(
        train_shards=train_shards,
        validation_shards=validation_shards,
        vocab_map=str(vocab_map),
        target=str(Path(target_config).parent),
        draft=draft_settings,
        train=train_settings,
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
        return TrainJob(**data, window=WindowJob(**window) if window else None)
    except TypeError as err:
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
