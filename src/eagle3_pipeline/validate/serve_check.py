"""The draft served by real vLLM: the target's own command line with `--speculative-config` added,
the validation questions sent through the chat API as generation sends them, and the spec-decode
counters read from /metrics before and after.

Local (the demo, `server.host: local`): the unit file's ExecStart runs as a second process on a free
port, next to (never instead of) the generation server. Production (an SSH host): see `dropin.py`,
a temporary drop-in on the same unit, because the draft must run on the GPUs the target runs on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.settings import GENERATION_DEFAULTS, SERVER_DEFAULTS, VALIDATE_DEFAULTS
from eagle3_pipeline.validate.interrupts import interrupts_as_exceptions
from eagle3_pipeline.validate.serving import (
    ServeCheckError,
    ask,
    load_questions,
    measure,
    serve_local,
    with_speculative_draft,
    write_json,
)

log = logging.getLogger(__name__)
# the rules turn the timing off for the baseline draft: the target alone is the same run for both
SPEEDUP_OFF = "not timed: validate.speedup is false, or this is the baseline draft's check"


def run_local_serve_check(
    server_cfg: dict[str, Any],
    checkpoint_dir: str | Path,
    questions: list[dict],
    sampling: Sampling,
    state_dir: str | Path,
    num_speculative_tokens: int,
    enforce_eager: bool = True,
    start_timeout_s: float = 900.0,
    port_range: tuple[int, int] = (18580, 18599),
    api_key: str | None = None,
    concurrency: int = 8,
    request_timeout_s: float = 600.0,
    matched: tuple[list[dict], Sampling] | None = None,
) -> dict[str, Any]:
    """Serve the local unit file's target with the draft on a free port, measure, stop it (always).

    Args:
        server_cfg: the `server` config section (unit, unit_file).
        checkpoint_dir: the exported draft.
        questions: from `load_questions`.
        sampling: the chat request's model name and sampling parameters.
        state_dir: where the server's log and pid file go.
        num_speculative_tokens: draft tokens per step.
        enforce_eager: add --enforce-eager (required by the CPU build).
        start_timeout_s: how long the server may take to answer /health.
        port_range: the ports tried, first free wins.
        api_key: the server's key, when its unit sets one.
        concurrency: requests in flight.
        request_timeout_s: seconds for one request.
        matched: questions and sampling of a second run on the same server, its figures under "sampled"
            (the generation's sampling: `matched_sampling`).
    """
    from eagle3_pipeline.server.lifecycle import local_command

    argv, env, cwd = local_command(server_cfg)

    def served(port: int) -> list[str]:
        words = with_speculative_draft(
            argv, str(checkpoint_dir), num_speculative_tokens, "127.0.0.1", port, enforce_eager
        )
        log.info("serving the draft: %s", " ".join(words))
        return words

    Path(state_dir).mkdir(parents=True, exist_ok=True)
    handle, base_url = serve_local(served, env, cwd, Path(state_dir), start_timeout_s, port_range)
    try:
        from eagle3_pipeline.validate.served import measure_by_source

        result = measure_by_source(
            lambda group: measure(base_url, group, sampling, api_key, concurrency, request_timeout_s),
            questions,
        )
        if matched is not None:
            result["sampled"] = measure(base_url, *matched, api_key, concurrency, request_timeout_s)
    finally:
        handle.stop()
    return result | {"mode": "local", "base_url": base_url}


def serve_sampling(generation: dict[str, Any], validate: dict[str, Any], model: str) -> Sampling:
    """Generation's sampling, with validate.max_tokens as a cap and validate.temperature when set."""
    sampling = Sampling.from_config(generation, model)
    max_tokens = min(sampling.max_tokens, validate.get("max_tokens") or sampling.max_tokens)
    temperature = validate.get("temperature")
    return Sampling(
        model=model,
        max_tokens=max_tokens,
        top_p=sampling.top_p,
        seed=sampling.seed,
        temperature=sampling.temperature if temperature is None else temperature,
        chat_template_kwargs=sampling.chat_template_kwargs,
    )


def matched_sampling(generation: dict[str, Any], validate: dict[str, Any], model: str) -> Sampling:
    """The generation's own sampling (what the validation traces were drawn with) at the check's
    max_tokens (settings.served_max_tokens): the served run the offline replay matches
    (validate/matched.py)."""
    cap = generation.get("max_tokens", GENERATION_DEFAULTS.max_tokens)
    return dataclasses.replace(
        Sampling.from_config(generation, model), max_tokens=min(cap, validate.get("max_tokens") or cap)
    )


def matched_questions(
    questions: list[dict],
    offline: dict[str, Any] | None,
    validate: dict[str, Any],
    max_tokens: int | None = None,
) -> list[dict]:
    """The questions whose traces offline.json replayed with the check's settings (`max_tokens`: the
    served requests'; a replay of whole traces, max_tokens null, fits any).

    Raises:
        ServeCheckError: offline.json has no replay, or one made with other settings (rerun validate_offline).
    """
    replay = (offline or {}).get("served_replay")
    k = validate["num_speculative_tokens"]
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


@interrupts_as_exceptions()  # SIGTERM (a SLURM cancel) unwinds through the cleanup: see dropin.py
def serve_check(
    checkpoint_dir: str | Path,
    validation_path: str | Path,
    server_json_path: str | Path,
    server_cfg: dict[str, Any],
    generation: dict[str, Any],
    validate: dict[str, Any],
    work_dir: str | Path,
    output_path: str | Path,
    offline_path: str | Path | None = None,
) -> dict[str, Any]:
    """Rule serve_check: serve the target with the draft, send the validation questions, write the
    spec-decode figures to `output_path` (validation/serve_check.json): acceptance overall and by
    source, the speedup over the target alone (local units), and the comparison with the offline
    simulation (`offline_path`, validation/offline.json; see validate/served.py).

    Raises:
        ServeCheckError: served and offline acceptance disagree beyond validate.served_offline_tolerance
            (the figures are kept in work_dir/serve_check.rejected.json).
    """
    from eagle3_pipeline.server import api_key, secrets
    from eagle3_pipeline.server.lifecycle import uses_local_process

    questions = load_questions(validation_path, validate["max_questions"])
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
        "num_speculative_tokens": validate["num_speculative_tokens"],
        "enforce_eager": validate.get("enforce_eager", VALIDATE_DEFAULTS.enforce_eager),
        "concurrency": min(generation.get("concurrency", GENERATION_DEFAULTS.concurrency), len(questions)),
        "request_timeout_s": generation.get("request_timeout_s", GENERATION_DEFAULTS.request_timeout_s),
        "matched": None if same_run else matched,
    }
    if uses_local_process(server_cfg):
        result = run_local_serve_check(
            server_cfg,
            **common,
            api_key=api_key(server_cfg),
            start_timeout_s=server_cfg.get("start_timeout_s", SERVER_DEFAULTS.start_timeout_s),
        )
    else:
        from eagle3_pipeline.validate.dropin import run_remote_serve_check

        result = run_remote_serve_check(server_cfg, server_json, **common, remote_dir=validate["remote_dir"])
    result |= {
        "question_ids": [q["id"] for q in questions],
        "checkpoint": str(checkpoint_dir),
        "num_speculative_tokens": validate["num_speculative_tokens"],
        "sampling": _sampling_dict(sampling),
    }
    if matched is not None:
        sampled = {k: v for k, v in result.items() if k in SAMPLED_KEYS} if same_run else result["sampled"]
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
    check_against_offline(result, offline_path, validate, work_dir)  # before the speedup: fail fast
    if uses_local_process(server_cfg):
        result["speedup"] = local_speedup(server_cfg, result, common, validate)
    else:  # restored and verified: production serves the target alone again
        result["speedup"] = production_speedup(server_cfg, server_json, result, common, validate)
    write_json(result, output_path)
    return result


SAMPLED_KEYS = (
    "acceptance_length", "accepted_per_position", "accepted_tokens", "answered", "completion_tokens",
    "conditional", "draft_acceptance_rate", "draft_tokens", "drafts", "failed", "per_position_rate",
    "questions", "seconds", "tokens_per_s",
)  # fmt: skip


def _sampling_dict(sampling: Sampling) -> dict[str, Any]:
    return {k: v for k, v in sampling.__dict__.items() if k != "model"} | {"model": sampling.model}


def local_speedup(
    server_cfg: dict[str, Any], with_draft: dict[str, Any], common: dict[str, Any], validate: dict[str, Any]
) -> dict[str, Any]:
    """validate.speedup: the same questions, sampling and concurrency against the target alone."""
    from eagle3_pipeline.validate.served import run_local_without_draft, speedup

    if not validate.get("speedup", VALIDATE_DEFAULTS.speedup):
        return {"speedup": None, "reason": SPEEDUP_OFF}
    without = run_local_without_draft(
        server_cfg,
        common["questions"],
        _group_asker(server_cfg, common),
        str(Path(common["state_dir"]) / "without-draft"),
        server_cfg.get("start_timeout_s", SERVER_DEFAULTS.start_timeout_s),
    )
    figures = speedup(with_draft, without)
    log.info(
        "served speedup %.2fx (%.1f tokens/s with the draft, %.1f without)",
        figures["speedup"] or 0.0,
        figures["tokens_per_s_with_draft"] or 0.0,
        figures["tokens_per_s_without_draft"] or 0.0,
    )
    return figures


def production_speedup(
    server_cfg: dict[str, Any],
    server_json: dict[str, Any],
    with_draft: dict[str, Any],
    common: dict[str, Any],
    validate: dict[str, Any],
) -> dict[str, Any]:
    """validate.speedup for a systemd unit: after the restore (health and model verified), production
    serves the target alone, so the same questions, sampling and concurrency are timed against it.
    Production may be serving users meanwhile; their load slows both runs alike only if it is steady."""
    from eagle3_pipeline.server import auth_headers, tls_verify
    from eagle3_pipeline.server.health import check_health
    from eagle3_pipeline.server.lifecycle import server_url
    from eagle3_pipeline.validate.served import speedup, time_by_source

    if not validate.get("speedup", VALIDATE_DEFAULTS.speedup):
        return {"speedup": None, "reason": SPEEDUP_OFF}
    base_url = server_url(server_json, server_cfg, Path(common["state_dir"]))
    if not check_health(base_url, auth_headers(server_cfg), verify=tls_verify(server_cfg)):
        return {
            "speedup": None,
            "reason": f"{server_cfg['unit']} is not serving after the restore (it was not running before)",
        }
    ask_group = _group_asker(server_cfg, common)
    figures = speedup(
        with_draft, time_by_source(lambda group: ask_group(base_url, group), common["questions"])
    )
    log.info("served speedup over production without the draft: %s", figures["speedup"])
    return figures | {"without_draft": "the production unit after the restore"}


def _group_asker(
    server_cfg: dict[str, Any], common: dict[str, Any]
) -> Callable[[str, list[dict]], list[dict[str, Any]]]:
    """(base_url, questions) -> outcomes, with the draft run's sampling, concurrency and timeout."""
    from eagle3_pipeline.server import api_key

    key = api_key(server_cfg)

    def ask_group(base_url: str, group: list[dict]) -> list[dict[str, Any]]:
        return ask(
            base_url, group, common["sampling"], key, common["concurrency"], common["request_timeout_s"], 2,
            server_cfg.get("ca_bundle"),
        )  # fmt: skip

    return ask_group


def check_against_offline(
    result: dict[str, Any], offline_path: str | Path | None, validate: dict[str, Any], work_dir: str | Path
) -> None:
    """Add the matched comparisons (validate/matched.py) to `result`: "offline_comparison", the first run
    (greedy by default) against its offline replay, enforced unless validate.served_offline_tolerance is
    null, and "sampled_comparison", the run at the generation's sampling against its replay, reported.
    Raise ServeCheckError when the enforced one disagrees (the figures kept in
    work_dir/serve_check.rejected.json)."""
    from eagle3_pipeline.validate.matched import compare_matched, reference_of, replayed_counts
    from eagle3_pipeline.validate.served import DEFAULT_TOLERANCE, disagreement_message

    if offline_path is None:
        return
    tolerance = validate.get("served_offline_tolerance", DEFAULT_TOLERANCE)
    allowance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    offline = json.loads(Path(offline_path).read_text())

    def matched(run: dict[str, Any]) -> dict[str, Any]:
        answered = [i for i in run["question_ids"] if i not in run.get("failed", {})]
        reference = reference_of(run["sampling"])
        replayed = replayed_counts(offline, answered, reference)
        return compare_matched(run, replayed, allowance) | {"reference": reference}

    comparison = matched(result)
    result["offline_comparison"] = comparison | {"enforced": tolerance is not None}
    if result.get("sampled"):
        result["sampled_comparison"] = matched(result["sampled"]) | {"enforced": False}
    if tolerance is not None and not comparison["agree"]:
        kept = Path(work_dir) / "serve_check.rejected.json"
        write_json(result, kept)
        raise ServeCheckError(f"{disagreement_message(comparison)} (figures: {kept})")
