"""The serve check on this machine (the demo, `server.host: local`): the local unit file's vLLM command
started as a second process on a free port, next to (never instead of) the generation server, with
the draft and measured, or without it and timed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.ports import reserved_port
from eagle3_pipeline.server.dropin import ServeCheckError
from eagle3_pipeline.server.health import wait_healthy
from eagle3_pipeline.server.local_process import launch_local, local_command
from eagle3_pipeline.server.process_identity import group_listens_on
from eagle3_pipeline.server.vllm_args import eagle3_draft, serving_argv
from eagle3_pipeline.settings import ServerSettings, ValidateSettings

log = logging.getLogger(__name__)
LOCAL_PORTS = (18580, 18599)  # tried in order, the first free one wins


def run_local_serve_check(
    server: ServerSettings,
    validate: ValidateSettings,
    checkpoint_dir: str | Path,
    questions: list[dict],
    sampling: Sampling,
    state_dir: str | Path,
    concurrency: int = 8,
    request_timeout_s: float = 600.0,
    matched: tuple[list[dict], Sampling] | None = None,
    port_range: tuple[int, int] = LOCAL_PORTS,
    per_request_metrics: bool = False,
) -> dict[str, Any]:
    """Serve the local unit file's target with the draft on a free port, measure, stop it (always).

    Args:
        server: the unit (unit, unit_file), its API key and how long it may take to answer /health.
        validate: the draft's tokens per step and --enforce-eager (required by the CPU build).
        checkpoint_dir: the exported draft.
        questions: from `spec_decode.load_questions`.
        sampling: the chat request's model name and sampling parameters.
        state_dir: where the server's log and pid file go.
        concurrency: requests in flight.
        request_timeout_s: seconds for one request.
        matched: questions and sampling of a second run on the same server, its figures under "sampled"
            (the generation's sampling: `serve_check.matched_sampling`).
        port_range: the ports tried, first free wins.
        per_request_metrics: ask vLLM for each reply's draft counts (vllm_args.supports_per_request_metrics).
    """
    from eagle3_pipeline.server import api_key
    from eagle3_pipeline.validate.served_figures import measure_by_source
    from eagle3_pipeline.validate.spec_decode import measure, served_layers

    argv, env, cwd = local_command(server)
    draft = eagle3_draft(str(checkpoint_dir), validate.num_speculative_tokens)

    def served(port: int) -> list[str]:
        words = serving_argv(argv, draft, "127.0.0.1", port, validate.enforce_eager, per_request_metrics)
        log.info("serving the draft: %s", " ".join(words))
        return words

    Path(state_dir).mkdir(parents=True, exist_ok=True)
    handle, base_url = serve_local(served, env, cwd, Path(state_dir), server.start_timeout_s, port_range)
    key = api_key(server)
    try:
        layers = served_layers(handle.log_path.read_text(errors="replace"), checkpoint_dir)
        result = measure_by_source(
            lambda group: measure(base_url, group, sampling, key, concurrency, request_timeout_s), questions
        )
        if matched is not None:
            result["sampled"] = measure(base_url, *matched, key, concurrency, request_timeout_s)
    finally:
        handle.stop()
    return result | {"mode": "local", "base_url": base_url, "auxiliary_layers": layers}


def run_local_by_k(
    server: ServerSettings,
    validate: ValidateSettings,
    checkpoint_dir: str | Path,
    runs: dict[str, tuple[list[dict], Sampling]],
    ks: list[int],
    state_dir: str | Path,
    concurrency: int = 8,
    request_timeout_s: float = 600.0,
    per_request_metrics: bool = False,
    port_range: tuple[int, int] = LOCAL_PORTS,
) -> dict[str, dict[str, Any]]:
    """The draft served at each of `ks` draft tokens (one server each, started and stopped in turn), every
    run of `runs` ({"greedy": (questions, sampling), "sampled": ...}) measured on it.

    Returns:
        {"k": {run: {acceptance_length, ci95, drafts, per_position_rate, answered}}}.
    """
    from eagle3_pipeline.server import api_key
    from eagle3_pipeline.validate.spec_decode import measure

    argv, env, cwd = local_command(server)
    key, figures = api_key(server), {}
    for k in ks:
        draft = eagle3_draft(str(checkpoint_dir), k)
        state = Path(state_dir) / f"k{k}"
        state.mkdir(parents=True, exist_ok=True)
        handle, base_url = serve_local(
            lambda port, draft=draft: serving_argv(
                argv, draft, "127.0.0.1", port, validate.enforce_eager, per_request_metrics
            ),
            env, cwd, state, server.start_timeout_s, port_range,
        )  # fmt: skip
        try:
            figures[str(k)] = {
                name: _curve_point(
                    measure(base_url, questions, sampling, key, concurrency, request_timeout_s)
                )
                for name, (questions, sampling) in runs.items()
            }
        finally:
            handle.stop()
        log.info("served at k = %d: %s", k, {n: f["acceptance_length"] for n, f in figures[str(k)].items()})
    return figures


def _curve_point(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("acceptance_length", "ci95", "drafts", "per_position_rate", "answered", "interval")
    return {key: run[key] for key in keys if key in run}


def run_local_speedup(
    server: ServerSettings,
    validate: ValidateSettings,
    checkpoint_dir: str | Path,
    questions: list[dict[str, Any]],
    ask: Callable[[str, list[dict[str, Any]], int], list[dict[str, Any]]],
    levels: list[int],
    state_dir: str | Path,
    per_request_metrics: bool = False,
    port_range: tuple[int, int] = LOCAL_PORTS,
) -> dict[str, Any]:
    """The local unit's target served twice at once, with the draft and without, and timed in
    alternation at each concurrency level (validate/speedup.py); both stopped (always)."""
    from eagle3_pipeline.validate.speedup import alternate

    argv, env, cwd = local_command(server)
    draft = eagle3_draft(str(checkpoint_dir), validate.num_speculative_tokens)
    handles = []
    try:
        urls = []
        for name, spec in (("with-draft", draft), ("without-draft", None)):
            state = Path(state_dir) / name
            state.mkdir(parents=True, exist_ok=True)
            handle, url = serve_local(
                lambda port, spec=spec: serving_argv(
                    argv, spec, "127.0.0.1", port, validate.enforce_eager and spec is not None,
                    per_request_metrics,
                ),
                env, cwd, state, server.start_timeout_s, port_range,
            )  # fmt: skip
            handles.append(handle)
            urls.append(url)
        return alternate(ask, urls[0], urls[1], questions, levels, validate.speedup_repeats)
    finally:
        for handle in handles:
            handle.stop()


PORT_ATTEMPTS = 3


def serve_local(
    command_on: Callable[[int], list[str]],
    env: dict[str, str],
    cwd: str | None,
    state_dir: Path,
    timeout_s: float,
    port_range: tuple[int, int],
) -> tuple[Any, str]:
    """Start the serving command (`command_on(port)`, see server.vllm_args.serving_argv) as a local
    process on a free port of `port_range` and wait for /health; returns (its handle, its base URL): the
    caller stops it.

    The port stays reserved until the server answers (`reserved_port`: another check starting on this
    host at the same moment picks another one). A program that ignores the reservation could still
    take it: the server that answers must hold the port itself (its process group's socket), or it is
    stopped and another port tried, so that a check never measures somebody else's server.
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        with reserved_port(*port_range) as port:
            base_url = f"http://127.0.0.1:{port}"
            handle = launch_local(command_on(port), env, cwd, state_dir, "serve-check")
            try:
                wait_healthy(base_url, timeout_s, handle.log_tail, handle.alive)
            except BaseException:
                handle.stop()
                raise
        if group_listens_on(handle.pid, port) is not False:
            return handle, base_url
        handle.stop()
        log.warning("port %d is served by another process (attempt %d): trying another", port, attempt)
    raise ServeCheckError(
        f"every port tried in {port_range[0]}-{port_range[1]} was taken by another server while vLLM "
        "started; stop the servers that listen there"
    )
