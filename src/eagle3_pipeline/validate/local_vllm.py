"""The serve check on this machine (the demo, `server.host: local`): the local unit file's vLLM command
started as a second process on a free port, next to (never instead of) the generation server, with
the draft and measured, or without it and timed.

`run_local_checks` starts every server the check needs at once (the draft at the check's k, at each
other k of validate.by_k_max, the target alone for validate.speedup): a vLLM start is mostly
single-threaded Python imports, so on the demo's 2 cores four starts together take about as long as
two one after another (five starts in a row were 3 of the check's 9 minutes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.ports import reserved_port
from eagle3_pipeline.server.draft_command import ServeCheckError
from eagle3_pipeline.server.health import wait_healthy
from eagle3_pipeline.server.local_process import launch_local, local_command
from eagle3_pipeline.server.process_identity import group_listens_on
from eagle3_pipeline.server.vllm_args import eagle3_draft, serving_argv
from eagle3_pipeline.settings import ServerSettings, ValidateSettings

log = logging.getLogger(__name__)
LOCAL_PORTS = (18580, 18599)  # tried in order, the first free one wins


def _curve_point(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("acceptance_length", "ci95", "drafts", "per_position_rate", "answered", "interval")
    return {key: run[key] for key in keys if key in run}


def start_local_servers(
    server: ServerSettings,
    validate: ValidateSettings,
    specs: dict[str, tuple[dict[str, Any] | None, Path]],
    per_request_metrics: bool = False,
    port_range: tuple[int, int] = LOCAL_PORTS,
) -> dict[str, tuple[Any, str]]:
    """Start every server of `specs` ({name: (--speculative-config or None for the target alone, its
    state folder)}) at once and wait until each answers /health; returns {name: (handle, base URL)}, the
    caller stops them. When one fails the others are stopped and its error raised."""
    argv, env, cwd = local_command(server)

    def start(spec: dict[str, Any] | None, state: Path) -> tuple[Any, str]:
        state.mkdir(parents=True, exist_ok=True)

        def words(port: int) -> list[str]:
            eager = validate.enforce_eager and spec is not None  # the target alone: as its unit says
            command = serving_argv(argv, spec, "127.0.0.1", port, eager, per_request_metrics)
            log.info("serving %s: %s", "the draft" if spec else "the target alone", " ".join(command))
            return command

        return serve_local(words, env, cwd, state, server.start_timeout_s, port_range)

    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        futures = {name: pool.submit(start, *spec) for name, spec in specs.items()}
    started, errors = {}, []
    for name, future in futures.items():
        try:
            started[name] = future.result()
        except BaseException as error:  # noqa: BLE001 - every started one is stopped before raising
            errors.append(error)
    if errors:
        for handle, _ in started.values():
            handle.stop()
        raise errors[0]
    return started


def run_local_checks(
    server: ServerSettings,
    validate: ValidateSettings,
    checkpoint_dir: str | Path,
    questions: list[dict],
    sampling: Sampling,
    state_dir: str | Path,
    conclude: Callable[[dict[str, Any]], dict[str, Any]],
    ask: Callable[[str, list[dict[str, Any]], int], list[dict[str, Any]]],
    concurrency: int = 8,
    request_timeout_s: float = 600.0,
    matched: tuple[list[dict], Sampling] | None = None,
    by_k: list[int] = (),
    speedup_levels: list[int] | None = None,
    per_request_metrics: bool = False,
    port_range: tuple[int, int] = LOCAL_PORTS,
) -> dict[str, Any]:
    """The whole local check, every server it needs started together (module docstring), then:

    1. the check measured on the draft's server at validate.num_speculative_tokens, the others idle
       (its timed greedy run stays its own), and `conclude(result)` (the comparison with the offline
       replay; it raises for a refused draft, which is then neither served at other k nor timed);
    2. the draft at each k of `by_k` measured at once (acceptance only, from each server's own
       counters) while the target alone answers the check's questions once, untimed, so that both
       arms of the timing start with the questions' prompts cached, as the check's server has them;
       those servers stopped;
    3. with `speedup_levels`, the check's server and the target alone timed in alternation
       (validate/speedup.py) with nothing else of the check running.

    Returns conclude's figures, with "by_k" ({k: {"greedy"|"sampled": figures}}, the k of `by_k`) and
    "speedup_figures" (`speedup.alternate`'s) when measured. Every server is stopped (always).
    """
    from eagle3_pipeline.server import api_key
    from eagle3_pipeline.validate.served_figures import measure_by_source
    from eagle3_pipeline.validate.spec_decode import measure, served_layers
    from eagle3_pipeline.validate.speedup import alternate

    state = Path(state_dir)
    specs = {"check": (eagle3_draft(str(checkpoint_dir), validate.num_speculative_tokens), state)}
    specs |= {f"k{k}": (eagle3_draft(str(checkpoint_dir), k), state / "by-k" / f"k{k}") for k in by_k}
    if speedup_levels:
        specs["without_draft"] = (None, state / "speedup" / "without-draft")
    servers = start_local_servers(server, validate, specs, per_request_metrics, port_range)
    key = api_key(server)
    try:
        handle, base_url = servers["check"]
        layers = served_layers(handle.log_path.read_text(errors="replace"), checkpoint_dir)
        result = measure_by_source(
            lambda group: measure(base_url, group, sampling, key, concurrency, request_timeout_s), questions
        )
        if matched is not None:
            result["sampled"] = measure(base_url, *matched, key, concurrency, request_timeout_s)
        result = conclude(result | {"mode": "local", "base_url": base_url, "auxiliary_layers": layers})
        runs = {"greedy": (questions, sampling), "sampled": matched or (questions, sampling)}

        def served_at(k: int) -> dict[str, Any]:
            url = servers[f"k{k}"][1]
            return {
                name: _curve_point(measure(url, asked, with_sampling, key, concurrency, request_timeout_s))
                for name, (asked, with_sampling) in runs.items()
            }

        with ThreadPoolExecutor(max_workers=len(by_k) + 1) as pool:
            curve = {str(k): pool.submit(served_at, k) for k in by_k}
            if speedup_levels:  # the warm-up of the target alone, untimed
                warm = pool.submit(ask, servers["without_draft"][1], questions, concurrency)
            if by_k:
                result["by_k"] = {k: future.result() for k, future in curve.items()}
            if speedup_levels:
                warm.result()
        for k in by_k:
            log.info(
                "served at k = %d: %s",
                k,
                {n: f["acceptance_length"] for n, f in result["by_k"][str(k)].items()},
            )
            servers.pop(f"k{k}")[0].stop()
        if speedup_levels:
            without_url = servers["without_draft"][1]
            result["speedup_figures"] = alternate(
                ask, base_url, without_url, questions, speedup_levels, validate.speedup_repeats
            )
        return result
    finally:
        for handle, _ in servers.values():
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
