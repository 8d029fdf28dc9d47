"""Rule serve_check: the draft served by real vLLM, the target's own command line with
`--speculative-config` added; the validation questions sent through the chat API as generation sends
them and vLLM's spec-decode counters read around them (spec_decode.py); the figures compared with the
offline simulation, by source, and the speedup over the target alone (served_figures.py).

Where it runs: a local unit (the demo, `server.host: local`) as a second process on a free port
(local_vllm.py); a systemd unit (production) by a check unit of its own that conflicts production and
whose stop systemd follows by starting production again (production_check.py): the draft must run on
the GPUs the target runs on, and production's unit is never written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.server import secrets
from eagle3_pipeline.server.dropin import ServeCheckError
from eagle3_pipeline.server.interrupts import interrupts_as_exceptions
from eagle3_pipeline.server.vllm_args import supports_per_request_metrics
from eagle3_pipeline.settings import GenerationSettings, ServerSettings, ValidateSettings
from eagle3_pipeline.validate.spec_decode import ask, load_questions

log = logging.getLogger(__name__)
# the rules turn the timing off for the baseline draft: the target alone is the same run for both
SPEEDUP_OFF = "not timed: validate.speedup is false, or this is the baseline draft's check"


def serve_sampling(generation: GenerationSettings, validate: ValidateSettings, model: str) -> Sampling:
    """Generation's sampling, with validate.max_tokens as a cap and validate.temperature when set."""
    sampling = Sampling.from_settings(generation, model)
    max_tokens = min(sampling.max_tokens, validate.max_tokens or sampling.max_tokens)
    temperature = validate.temperature
    return Sampling(
        model=model,
        max_tokens=max_tokens,
        top_p=sampling.top_p,
        seed=sampling.seed,
        temperature=sampling.temperature if temperature is None else temperature,
        chat_template_kwargs=sampling.chat_template_kwargs,
    )


def matched_sampling(generation: GenerationSettings, validate: ValidateSettings, model: str) -> Sampling:
    """The generation's own sampling (what the validation traces were drawn with) at the check's
    max_tokens (settings.served_max_tokens): the served run the offline replay matches
    (validate/matched.py)."""
    cap = generation.max_tokens
    return dataclasses.replace(
        Sampling.from_settings(generation, model), max_tokens=min(cap, validate.max_tokens or cap)
    )


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
    (`offline_path`, validation/offline.json; see served_figures.py).

    Raises:
        ServeCheckError: served and offline acceptance disagree beyond validate.served_offline_tolerance
            (the figures are kept in work_dir/serve_check.rejected.json).
    """
    from eagle3_pipeline.server.backend import backend_for

    questions = load_questions(validation_path, validate.max_questions)
    server_json = json.loads(Path(server_json_path).read_text())
    secrets.learn(server_json)  # the unit's secrets, hidden in this job's log and errors
    model = server_json.get("served_model_name") or server_json["model"]
    sampling = serve_sampling(generation, validate, model)
    offline = json.loads(Path(offline_path).read_text()) if offline_path is not None else None
    matched = None
    if offline is not None:  # the run the offline replay matches: fresh replies at generation's sampling
        sampled = matched_sampling(generation, validate, model)
        questions = matched_questions(questions, offline, validate, sampled.max_tokens)
        matched = (questions, sampled)
    same_run = matched is not None and matched == (questions, sampling)
    common = {
        "checkpoint_dir": checkpoint_dir,
        "questions": questions,
        "sampling": sampling,
        "state_dir": work_dir,
        "concurrency": min(generation.concurrency, len(questions)),
        "request_timeout_s": generation.request_timeout_s,
        "matched": None if same_run else matched,
    }
    local = not backend_for(server, Path(work_dir)).can_install_dropin  # a process the pipeline runs
    per_request = supports_per_request_metrics(server_json.get("vllm_version"))

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

    if local:
        result = local_check(server, validate, common, conclude, per_request)
    else:
        from eagle3_pipeline.validate.production_check import run_remote_serve_check

        result = conclude(run_remote_serve_check(server, validate, server_json, **common))
        if validate.by_k_max:
            result["by_k"] = {"reason": "not measured: a systemd unit would restart production once per k"}
        # restored and verified: production serves the target alone again
        result["speedup"] = production_speedup(server, server_json, result, common, validate)
    write_json(result, output_path)
    return result


SAMPLED_KEYS = (
    "acceptance_length", "accepted_per_position", "accepted_tokens", "answered", "completion_tokens",
    "conditional", "draft_acceptance_rate", "draft_tokens", "drafts", "failed", "per_position_rate",
    "questions", "seconds", "tokens_per_s", "per_question", "ci95", "interval",
)  # fmt: skip


def local_check(
    server: ServerSettings,
    validate: ValidateSettings,
    common: dict[str, Any],
    conclude: Callable[[dict[str, Any]], dict[str, Any]],
    per_request: bool,
) -> dict[str, Any]:
    """A local unit's check (local_vllm.run_local_checks: its servers started together): the check,
    validate.by_k_max's curve (served acceptance at k = 1 .. by_k_max, greedy and at the generation's
    sampling on the same questions; the check's own k from its runs, every other k on a server of its
    own) and validate.speedup (the target with and without the draft timed in alternation at 1, the
    check's and twice the check's concurrency, validate.speedup_repeats times each:
    validate/speedup.py)."""
    from eagle3_pipeline.validate.local_vllm import _curve_point, run_local_checks
    from eagle3_pipeline.validate.speedup import concurrency_levels, headline

    k_main = validate.num_speculative_tokens
    others = [k for k in range(1, validate.by_k_max + 1) if k != k_main]
    questions, concurrency = common["questions"], common["concurrency"]
    levels = concurrency_levels(concurrency, len(questions)) if validate.speedup else None
    ask_group = _group_asker(server, common)
    result = run_local_checks(
        server, validate, conclude=conclude, ask=lambda url, group, level: ask_group(url, group, level),
        by_k=others, speedup_levels=levels, per_request_metrics=per_request, **common,
    )  # fmt: skip
    if validate.by_k_max:
        figures = result.pop("by_k", {})
        if k_main <= validate.by_k_max:
            sampled = result.get("sampled") or result
            figures[str(k_main)] = {"greedy": _curve_point(result), "sampled": _curve_point(sampled)}
        result["by_k"] = {k: figures[k] for k in sorted(figures, key=int)}
    timed = result.pop("speedup_figures", None)
    if timed is None:
        result["speedup"] = {"speedup": None, "reason": SPEEDUP_OFF}
        return result
    device = "cpu (vLLM's CPU build: a CPU figure, not a GPU claim)"
    result["speedup"] = headline(timed, concurrency, device)
    log.info(
        "served speedup %.2fx at concurrency %d (median of %d alternating repeats, range %s)",
        result["speedup"]["speedup"] or 0.0,
        concurrency,
        timed["repeats"],
        result["speedup"]["speedup_range"],
    )
    return result


def _sampling_dict(sampling: Sampling) -> dict[str, Any]:
    return {k: v for k, v in sampling.__dict__.items() if k != "model"} | {"model": sampling.model}


def production_speedup(
    server: ServerSettings,
    server_json: dict[str, Any],
    with_draft: dict[str, Any],
    common: dict[str, Any],
    validate: ValidateSettings,
) -> dict[str, Any]:
    """validate.speedup for a systemd unit: after the restore (health and model verified), production
    serves the target alone, so the same questions, sampling and concurrency are timed against it.
    Production may be serving users meanwhile; their load slows both runs alike only if it is steady."""
    from eagle3_pipeline.server import auth_headers, tls_verify
    from eagle3_pipeline.server.health import check_health
    from eagle3_pipeline.server.lifecycle import server_url
    from eagle3_pipeline.validate.served_figures import speedup, time_by_source

    if not validate.speedup:
        return {"speedup": None, "reason": SPEEDUP_OFF}
    base_url = server_url(server_json, server, Path(common["state_dir"]))
    if not check_health(base_url, auth_headers(server), verify=tls_verify(server)):
        return {
            "speedup": None,
            "reason": f"{server.unit} is not serving after the restore (it was not running before)",
        }
    ask_group = _group_asker(server, common)
    figures = speedup(
        with_draft, time_by_source(lambda group: ask_group(base_url, group), common["questions"])
    )
    log.info("served speedup over production without the draft: %s", figures["speedup"])
    return figures | {"without_draft": "the production unit after the restore"}


def _group_asker(
    server: ServerSettings, common: dict[str, Any]
) -> Callable[[str, list[dict]], list[dict[str, Any]]]:
    """(base_url, questions[, concurrency]) -> outcomes, with the draft run's sampling, concurrency (unless
    given) and timeout."""
    from eagle3_pipeline.server import api_key

    key = api_key(server)

    def ask_group(base_url: str, group: list[dict], concurrency: int | None = None) -> list[dict[str, Any]]:
        return ask(
            base_url, group, common["sampling"], key, concurrency or common["concurrency"],
            common["request_timeout_s"], 2, server.ca_bundle,
        )  # fmt: skip

    return ask_group


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
