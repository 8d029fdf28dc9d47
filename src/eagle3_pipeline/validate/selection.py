"""Selection by acceptance: which epoch's draft to ship.

Training keeps the draft's weights after every validate.select_every_epochs-th epoch and after the last
(draft/trained/epochs/); rule select_checkpoint measures each one's offline acceptance on the
validation states (validate/offline.py, the figure validate_offline reports for the shipped draft) and
keeps the one with the longest acceptance at the served number of draft tokens
(validate.num_speculative_tokens): export_draft exports it, the serve check serves it. Published
drafts were chosen so because acceptance and loss part ways: EAGLE-3's peaked near 4.6 epochs while its
validation loss kept falling.

Importable without torch (the rules read `kept_epochs` at parse time): the measurement imports the
offline code inside `select_checkpoint`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eagle3_pipeline import io

log = logging.getLogger(__name__)


def kept_epochs(epochs: int, every: int) -> list[int]:
    """The epochs (0-based) whose weights training keeps: every `every`-th (counted from 1) and the last;
    none when `every` is 0 (selection off: the final weights are shipped as trained)."""
    if every <= 0:
        return []
    return sorted({e for e in range(epochs) if (e + 1) % every == 0} | {epochs - 1})


def criterion_k(num_speculative_tokens: int, steps: int) -> int:
    """The draft length the choice is made at: the served one, at most the steps measured offline."""
    return max(1, min(num_speculative_tokens, steps))


def choose(candidates: Sequence[Mapping[str, Any]], k: int) -> dict[str, Any]:
    """The candidate with the longest offline acceptance at k draft tokens (a tie goes to the later
    epoch: as good and trained longer), and why, against the last epoch.

    Args:
        candidates: {"epoch", "acceptance_length": [tau(1), ..]} in epoch order.
        k: draft tokens (criterion_k).

    Raises:
        ValueError: no candidate.
    """
    if not candidates:
        raise ValueError("no checkpoint to choose from (validate.select_every_epochs kept none)")
    best = max(candidates, key=lambda c: (c["acceptance_length"][k - 1], c["epoch"]))
    last = candidates[-1]
    tau, tau_last = best["acceptance_length"][k - 1], last["acceptance_length"][k - 1]
    # counted from 1 in the reason (as the report's axis), from 0 in "epoch" (as history.json)
    if best is last:
        reason = (
            f"the last epoch ({last['epoch'] + 1}) has the longest offline acceptance at k = {k}: {tau:.3f}"
        )
    else:
        reason = (
            f"epoch {best['epoch'] + 1} has the longest offline acceptance at k = {k}: {tau:.3f}, "
            f"{tau - tau_last:+.3f} over the last epoch ({last['epoch'] + 1}: {tau_last:.3f})"
        )
    return {
        "epoch": best["epoch"],
        "acceptance_length": tau,
        "last_epoch_acceptance_length": tau_last,
        "reason": reason,
    }


def candidate(epoch: int, history: Sequence[Mapping[str, Any]], offline: Mapping[str, Any]) -> dict[str, Any]:
    """One point of the curve: the epoch's training record (step, losses) and its offline acceptance."""
    record = next((r for r in history if r["epoch"] == epoch), {})
    train, validation = record.get("train") or {}, record.get("validation") or {}
    return {
        "epoch": epoch,
        "step": record.get("step"),
        "train_loss": train.get("loss"),
        "validation_loss": validation.get("loss"),
        "conditional": offline["conditional"],
        "acceptance_length": offline["acceptance_length"],
        "ci95": offline.get("ci95"),  # per k, question-level
        "anchors": offline["anchors"],
        "per_sample": offline.get("per_sample"),  # for the optimism; not written to selection.json
    }


def selection_record(
    candidates: list[dict[str, Any]], num_speculative_tokens: int, every: int
) -> dict[str, Any]:
    """selection.json: the curve (epoch, step, losses, offline acceptance per position and length) and
    the chosen epoch with its reason."""
    k = criterion_k(num_speculative_tokens, len(candidates[0]["acceptance_length"]))
    return {
        "criterion": f"offline acceptance length at k = {k} draft tokens (validate.num_speculative_tokens)",
        "k": k,
        "select_every_epochs": every,
        "chosen": choose(candidates, k),
        "candidates": [{key: v for key, v in c.items() if key != "per_sample"} for c in candidates],
        "optimism": optimism(candidates, k),
    }


def optimism(candidates: Sequence[Mapping[str, Any]], k: int) -> dict[str, Any] | None:
    """The measured optimism of choosing the epoch on the questions it is then reported on (no held-out
    selection split: the validation questions are few, and the served check asks the same ones):
    validate/intervals.py `selection_optimism` over the candidates' per-question counts."""
    from eagle3_pipeline.validate.intervals import selection_optimism

    samples = [c.get("per_sample") or {} for c in candidates]
    ids = sorted(set.intersection(*(set(s) for s in samples))) if samples else []
    if not ids:
        return None
    rows = [[(s[i][0], s[i][1:]) for i in ids] for s in samples]
    return selection_optimism(rows, k) | {
        "method": "bootstrap: the epoch chosen on each resample of the validation questions, its figure "
        "there minus its figure on all of them (the chosen figure overstates by about this much)",
        "selection_split": "none: the epoch is chosen on the validation questions it is reported on",
    }


def select_checkpoint(
    checkpoints: Sequence[str | Path],
    epochs: Sequence[int],
    history_path: str | Path,
    vocab_map: str | Path,
    target_config: str | Path,
    hidden_states_metadata: str | Path,
    validation_states: Sequence[str | Path],
    steps: int,
    num_speculative_tokens: int,
    every: int,
    output_weights: str | Path,
    output_selection: str | Path,
    cpu_threads: int = 0,
) -> dict[str, Any]:
    """Rule select_checkpoint: each kept epoch's weights exported (EAGLE-3, as export_draft does) to a
    scratch folder and measured offline; the best one's weights copied to `output_weights`, the curve
    written to `output_selection`. cpu_threads: torch threads without a GPU (the rule's threads)."""
    import json

    import torch

    from eagle3_pipeline.draft.export import export_checkpoint
    from eagle3_pipeline.validate.offline import evaluate

    if cpu_threads > 0 and not torch.cuda.is_available():
        torch.set_num_threads(cpu_threads)  # as training: more threads than free cores slows OpenMP ops

    history = json.loads(Path(history_path).read_text())
    target_dir = Path(target_config).parent
    candidates = []
    Path(output_weights).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="select-", dir=Path(output_weights).parent) as scratch:
        for epoch, weights in zip(epochs, checkpoints, strict=True):
            folder = Path(scratch) / f"epoch-{epoch}"
            export_checkpoint(
                weights,
                vocab_map,
                target_config,
                hidden_states_metadata,
                folder / "config.json",
                folder / "model.safetensors",
            )
            offline = evaluate(folder, target_dir, validation_states, steps)
            candidates.append(candidate(epoch, history, offline))
            log.info(
                "epoch %d: offline acceptance length %s",
                epoch,
                [round(x, 3) for x in offline["acceptance_length"]],
            )
    record = selection_record(candidates, num_speculative_tokens, every)
    chosen = record["chosen"]
    record["chosen"]["weights"] = str(checkpoints[list(epochs).index(chosen["epoch"])])
    # a copy, not a link: a new file, newer than every input (a link would keep the epoch file's time)
    with io.atomic_path(output_weights) as tmp:
        shutil.copyfile(record["chosen"]["weights"], tmp)
    io.write_json(record, output_selection, indent=1)
    log.info("chosen: %s", chosen["reason"])
    return record
