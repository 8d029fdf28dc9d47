"""Rule serve_check: the draft served by real vLLM, the target's own command line with
`--speculative-config` added; the validation questions sent through the chat API as generation sends
them and vLLM's spec-decode counters read around them (spec_decode.py); the figures, by source
(served_figures.py), compared with the same run replayed offline (matched.py), and the speedup over the
target alone.

Where it runs is the server backend's (draft_serving.py): a local unit (the demo, `server.host: local`)
as second processes on free ports (local_vllm.py); a systemd unit (production) by a check unit of its
own that conflicts production and whose stop systemd follows by starting production again
(production_check.py): the draft must run on the GPUs the target runs on, and production's unit is
never written. This module does not ask which.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from eagle3_pipeline import io, secrets
from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.server.draft_command import ServeCheckError
from eagle3_pipeline.server.interrupts import interrupts_as_exceptions
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import GenerationSettings, ServerSettings, ValidateSettings, served_max_tokens
from eagle3_pipeline.validate.draft_serving import ServeCheckRun, draft_serving
from eagle3_pipeline.validate.spec_decode import load_questions

log = logging.getLogger(__name__)


# The serve check's requests carry the generation's Sampling whole (Sampling.from_settings: every value a
# generation request sends, the optional sampling keys, seed, chat_template_kwargs and extra_body), so a
# draft is checked at the settings production serves. Overridden, here only:
# - max_tokens, in both runs: settings.served_max_tokens (validate.max_tokens caps it so that the check
#   stays affordable on long replies; the offline replay walks the traces to the same length);
# - temperature, in the first run only: validate.temperature when set (greedy by default, the diagnostic
#   run whose replay is the target's argmax); the second run keeps the generation's own. The greedy run
#   keeps the penalties too (vLLM's rejection sampler applies them to the target's logits, greedy too,
#   which the replay's plain argmax then only approximates: a diagnostic).
def matched_sampling(generation: GenerationSettings, validate: ValidateSettings, model: str) -> Sampling:
    """The generation's own sampling (what the validation traces were drawn with) at the check's
    max_tokens: the served run the offline replay matches (validate/matched.py)."""
    return dataclasses.replace(
        Sampling.from_settings(generation, model), max_tokens=served_max_tokens(generation, validate)
    )


def serve_sampling(generation: GenerationSettings, validate: ValidateSettings, model: str) -> Sampling:
    """The first run's: matched_sampling at validate.temperature when set."""
    sampling = matched_sampling(generation, validate, model)
    if validate.temperature is None:
        return sampling
    return dataclasses.replace(sampling, temperature=validate.temperature)


def matched_questions(
    questions: list[dict],
    offline: dict[str, Any] | None,
    validate: ValidateSettings,
    max_tokens: int | None = None,
) -> list[dict]:
    """The questions whose traces offline.json replayed with the check's settings (`max_tokens`: the
    served requests'; a replay of whole traces, max_tokens null, fits any).

    Raises:
        ServeCheckError: offline.json has no replay, or one made with other settings (rerun validate_offline).
    """
    replay = (offline or {}).get("served_replay")
    k = validate.num_speculative_tokens
    if (
        not replay
        or replay.get("num_speculative_tokens") != k
        or replay.get("max_tokens") not in (None, max_tokens)
    ):
        raise ServeCheckError(
            f"offline.json has no replay of the served run with {k} draft tokens and max_tokens "
            f"{max_tokens}: rerun validate_offline (snakemake --forcerun validate_offline)"
        )
    chosen = [q for q in questions if q["id"] in replay["samples"]]
    if not chosen:
        raise ServeCheckError("none of the served validation questions has hidden states in offline.json")
    return chosen


@interrupts_as_exceptions()  # SIGTERM (a SLURM cancel) unwinds through the restore: server/host_record.py
def serve_check(
    checkpoint_dir: str | Path,
    validation_path: str | Path,
    server_json_path: str | Path,
    server: ServerSettings,
    generation: GenerationSettings,
    validate: ValidateSettings,
    work_dir: str | Path,
    output_path: str | Path,
    offline_path: str | Path | None = None,
) -> dict[str, Any]:
    """Rule serve_check: serve the target with the draft, send the validation questions, write the
    spec-decode figures to `output_path` (validation/serve_check.json): acceptance overall and by
    source, the speedup over the target alone, and the comparison with the offline simulation
    (`offline_path`, validation/offline.json; see matched.py).

    Raises:
        ServeCheckError: served and offline acceptance disagree beyond validate.served_offline_tolerance
            (the figures are kept in work_dir/serve_check.rejected.json).
    """
    questions = load_questions(validation_path, validate.max_questions)
    snapshot = ServerSnapshot.load(server_json_path)
    secrets.learn(snapshot)  # the unit's secrets, hidden in this job's log and errors
    model = snapshot.request_model
    sampling = serve_sampling(generation, validate, model)
    offline = json.loads(Path(offline_path).read_text()) if offline_path is not None else None
    matched = None
    if offline is not None:  # the run the offline replay matches: fresh replies at generation's sampling
        sampled = matched_sampling(generation, validate, model)
        questions = matched_questions(questions, offline, validate, sampled.max_tokens)
        matched = (questions, sampled)
    same_run = matched is not None and matched == (questions, sampling)
    run = ServeCheckRun(
        checkpoint_dir=checkpoint_dir,
        questions=questions,
        sampling=sampling,
        state_dir=Path(work_dir),
        concurrency=min(generation.concurrency, len(questions)),
        request_timeout_s=generation.request_timeout_s,
        matched=None if same_run else matched,
    )

    def conclude(result: dict[str, Any]) -> dict[str, Any]:
        """The check's own figures completed and compared with the offline replay (raises when the
        enforced comparison disagrees: before anything else is served or timed)."""
        result |= {
            "question_ids": [q["id"] for q in questions],
            "checkpoint": str(checkpoint_dir),
            "num_speculative_tokens": validate.num_speculative_tokens,
            "sampling": _sampling_dict(sampling),
        }
        if matched is not None:
            sampled = (
                {k: v for k, v in result.items() if k in SAMPLED_KEYS} if same_run else result["sampled"]
            )
            result["sampled"] = sampled | {
                "sampling": _sampling_dict(matched[1]),
                "question_ids": [q["id"] for q in matched[0]],
            }
        log.info(
            "serve check: acceptance length %s over %d drafts (%d/%d questions answered)%s",
            result["acceptance_length"],
            result["drafts"],
            result["answered"],
            result["questions"],
            f"; at the generation's sampling {result['sampled']['acceptance_length']}" if matched else "",
        )
        check_against_offline(result, offline_path, validate, work_dir)  # before by-k and the speedup
        return result

    serving = draft_serving(server, validate, snapshot, run.state_dir)
    result = serving.serve_with_draft(run, conclude)
    result["speedup"] = serving.time_without_draft(run, result)
    write_json(result, output_path)
    return result


SAMPLED_KEYS = (
    "acceptance_length", "accepted_per_position", "accepted_tokens", "answered", "completion_tokens",
    "conditional", "draft_acceptance_rate", "draft_tokens", "drafts", "failed", "per_position_rate",
    "questions", "seconds", "tokens_per_s", "per_question", "ci95", "interval",
)  # fmt: skip


def _sampling_dict(sampling: Sampling) -> dict[str, Any]:
    return {k: v for k, v in sampling.__dict__.items() if k != "model"} | {"model": sampling.model}


def check_against_offline(
    result: dict[str, Any], offline_path: str | Path | None, validate: ValidateSettings, work_dir: str | Path
) -> None:
    """Add the matched comparisons (validate/matched.py) to `result`: "sampled_comparison", the run at
    the generation's own sampling (what production serves) against its replay, enforced unless
    validate.served_offline_tolerance is null, and "offline_comparison", the first run (greedy by
    default) against its replay, a diagnostic (enforced only when there is no sampled run). Raise
    ServeCheckError when the enforced one disagrees (the figures kept in
    work_dir/serve_check.rejected.json)."""
    from eagle3_pipeline.validate.matched import compare_matched, reference_of, replayed_counts
    from eagle3_pipeline.validate.served_figures import REPORTED_TOLERANCE, disagreement_message

    if offline_path is None:
        return
    tolerance = validate.served_offline_tolerance
    allowance = REPORTED_TOLERANCE if tolerance is None else tolerance
    offline = json.loads(Path(offline_path).read_text())

    def matched(run: dict[str, Any]) -> dict[str, Any]:
        answered = [i for i in run["question_ids"] if i not in run.get("failed", {})]
        reference = reference_of(run["sampling"])
        replayed = replayed_counts(offline, answered, reference)
        return compare_matched(run, replayed, allowance, ids=answered) | {"reference": reference}

    sampled = matched(result["sampled"]) if result.get("sampled") else None
    result["offline_comparison"] = matched(result) | {"enforced": tolerance is not None and sampled is None}
    if sampled is not None:
        result["sampled_comparison"] = sampled | {"enforced": tolerance is not None}
    decisive = result["sampled_comparison" if sampled is not None else "offline_comparison"]
    if tolerance is not None and not decisive["agree"]:
        kept = Path(work_dir) / "serve_check.rejected.json"
        write_json(result, kept)
        raise ServeCheckError(f"{disagreement_message(decisive)} (figures: {kept})")


def write_json(data: dict[str, Any], path: str | Path) -> None:
    """Write JSON atomically (a temporary file renamed into place), the unit's secrets redacted as
    values (a vLLM error or log tail in the figures can carry one)."""
    io.write_json(secrets.redact_data(data), path, indent=2, sort_keys=True)
