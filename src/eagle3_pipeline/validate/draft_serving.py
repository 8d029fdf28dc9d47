"""How the serve check serves the draft, by the configured server's backend (server/backend.py decides
which, once; `draft_serving` maps it here): each offers "serve with this draft" (the check's figures,
concluded, with validate.by_k_max's curve or why it was not measured) and "time without it"
(validate.speedup: the target alone against the draft's run).

- `LocalDraftServing` (`LocalProcessBackend`, the demo): the unit's vLLM command as second processes
  on free ports, every server the check needs started together (local_vllm.run_local_checks), so the
  target alone is timed beside the draft there and only reported by `time_without_draft`.
- `ProductionDraftServing` (`SystemdUnitBackend`: an SSH host, or this machine's systemd): the draft in a
  check unit of its own beside the untouched production unit, restored afterwards
  (production_check.py); by-k is not measured, and the target alone is production after the restore.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from eagle3_pipeline.generate.client import Sampling
from eagle3_pipeline.server.backend import LocalProcessBackend, ServerBackend, SystemdUnitBackend, backend_for
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import ServerSettings, ValidateSettings
from eagle3_pipeline.validate.spec_decode import ask

log = logging.getLogger(__name__)
# the rules turn the timing off for the baseline draft: the target alone is the same run for both
SPEEDUP_OFF = "not timed: validate.speedup is false, or this is the baseline draft's check"
Conclude = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ServeCheckRun:
    """What one serve check sends, whichever server answers it."""

    checkpoint_dir: str | Path  # the exported draft
    questions: list[dict]
    sampling: Sampling  # the first run's (greedy by default)
    state_dir: Path  # the check's work folder: servers' logs, pid files, the tunnel's state
    concurrency: int
    request_timeout_s: float
    # a second run on the same server (the generation's sampling), its figures under "sampled"
    matched: tuple[list[dict], Sampling] | None = None

    def measured(self) -> dict[str, Any]:
        """As keyword arguments of the measuring functions (run_local_checks, run_remote_serve_check)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


class DraftServing(ABC):
    """The serve check on one kind of server (module docstring)."""

    def __init__(
        self, server: ServerSettings, validate: ValidateSettings, snapshot: ServerSnapshot | Mapping[str, Any]
    ) -> None:
        self.server, self.validate = server, validate
        self.snapshot = ServerSnapshot.of(snapshot)  # server.json (tests may pass its dict)

    @abstractmethod
    def serve_with_draft(self, run: ServeCheckRun, conclude: Conclude) -> dict[str, Any]:
        """The check's figures on the served draft, passed through `conclude` (the comparison with the
        offline replay: it raises for a refused draft before anything else is served or timed), with
        "by_k" when validate.by_k_max asks for it."""

    @abstractmethod
    def time_without_draft(self, run: ServeCheckRun, with_draft: dict[str, Any]) -> dict[str, Any]:
        """serve_check.json's "speedup": the target alone against `with_draft`, or why it was not timed."""


class LocalDraftServing(DraftServing):
    """A local unit's check: its servers started together (local_vllm.run_local_checks)."""

    _timed: dict[str, Any] | None = None  # speedup.alternate's figures, timed during serve_with_draft

    def serve_with_draft(self, run: ServeCheckRun, conclude: Conclude) -> dict[str, Any]:
        """The check, validate.by_k_max's curve (served acceptance at k = 1 .. by_k_max, greedy and at the
        generation's sampling on the same questions; the check's own k from its runs, every other k on a
        server of its own) and validate.speedup's timing (the target with and without the draft in
        alternation at 1, the check's and twice the check's concurrency, validate.speedup_repeats times
        each: validate/speedup.py)."""
        from eagle3_pipeline.server.vllm_args import supports_per_request_metrics
        from eagle3_pipeline.validate.local_vllm import _curve_point, run_local_checks
        from eagle3_pipeline.validate.speedup import concurrency_levels

        validate = self.validate
        k_main = validate.num_speculative_tokens
        others = [k for k in range(1, validate.by_k_max + 1) if k != k_main]
        levels = concurrency_levels(run.concurrency, len(run.questions)) if validate.speedup else None
        ask_group = _group_asker(self.server, run)
        per_request = supports_per_request_metrics(self.snapshot.vllm_version)
        result = run_local_checks(
            self.server,
            validate,
            conclude=conclude,
            ask=lambda url, group, level: ask_group(url, group, level),
            by_k=others,
            speedup_levels=levels,
            per_request_metrics=per_request,
            **run.measured(),
        )
        if validate.by_k_max:
            figures = result.pop("by_k", {})
            if k_main <= validate.by_k_max:
                sampled = result.get("sampled") or result
                figures[str(k_main)] = {"greedy": _curve_point(result), "sampled": _curve_point(sampled)}
            result["by_k"] = {k: figures[k] for k in sorted(figures, key=int)}
        self._timed = result.pop("speedup_figures", None)
        return result

    def time_without_draft(self, run: ServeCheckRun, with_draft: dict[str, Any]) -> dict[str, Any]:
        """The timing serve_with_draft made beside the check, as the headline (speedup.headline)."""
        from eagle3_pipeline.validate.speedup import headline

        timed = self._timed
        if timed is None:
            return {"speedup": None, "reason": SPEEDUP_OFF}
        device = "cpu (vLLM's CPU build: a CPU figure, not a GPU claim)"
        figures = headline(timed, run.concurrency, device)
        log.info(
            "served speedup %.2fx at concurrency %d (median of %d alternating repeats, range %s)",
            figures["speedup"] or 0.0,
            run.concurrency,
            timed["repeats"],
            figures["speedup_range"],
        )
        return figures


class ProductionDraftServing(DraftServing):
    """A systemd unit's check: the draft in a check unit beside production (production_check.py)."""

    BY_K_OFF: ClassVar[str] = "not measured: a systemd unit would restart production once per k"

    def serve_with_draft(self, run: ServeCheckRun, conclude: Conclude) -> dict[str, Any]:
        from eagle3_pipeline.validate.production_check import run_remote_serve_check

        measured = run_remote_serve_check(self.server, self.validate, self.snapshot, **run.measured())
        result = conclude(measured)
        if self.validate.by_k_max:
            result["by_k"] = {"reason": self.BY_K_OFF}
        return result

    def time_without_draft(self, run: ServeCheckRun, with_draft: dict[str, Any]) -> dict[str, Any]:
        """After the restore (health and model verified), production serves the target alone, so the same
        questions, sampling and concurrency are timed against it. Production may be serving users
        meanwhile; their load slows both runs alike only if it is steady."""
        from eagle3_pipeline.server import auth_headers, tls_verify
        from eagle3_pipeline.server.health import check_health
        from eagle3_pipeline.server.lifecycle import server_url
        from eagle3_pipeline.validate.served_figures import speedup, time_by_source

        server = self.server
        if not self.validate.speedup:
            return {"speedup": None, "reason": SPEEDUP_OFF}
        base_url = server_url(self.snapshot, server, run.state_dir)
        if not check_health(base_url, auth_headers(server), verify=tls_verify(server)):
            return {
                "speedup": None,
                "reason": f"{server.unit} is not serving after the restore (it was not running before)",
            }
        ask_group = _group_asker(server, run)
        figures = speedup(with_draft, time_by_source(lambda group: ask_group(base_url, group), run.questions))
        log.info("served speedup over production without the draft: %s", figures["speedup"])
        return figures | {"without_draft": "the production unit after the restore"}


# each backend's serving of the draft: a backend without one fails the unit tests
SERVING: dict[type[ServerBackend], type[DraftServing]] = {
    LocalProcessBackend: LocalDraftServing,
    SystemdUnitBackend: ProductionDraftServing,
}


def draft_serving(
    server: ServerSettings,
    validate: ValidateSettings,
    snapshot: ServerSnapshot | Mapping[str, Any],
    state_dir: Path,
) -> DraftServing:
    """The serve check on the configured server: its backend's serving (backend_for decides the kind)."""
    return SERVING[type(backend_for(server, state_dir))](server, validate, snapshot)


def _group_asker(server: ServerSettings, run: ServeCheckRun) -> Callable[..., list[dict[str, Any]]]:
    """(base_url, questions[, concurrency]) -> outcomes, with the draft run's sampling, concurrency (unless
    given) and timeout."""
    from eagle3_pipeline.server import api_key

    key = api_key(server)

    def ask_group(base_url: str, group: list[dict], concurrency: int | None = None) -> list[dict[str, Any]]:
        return ask(
            base_url, group, run.sampling, key, concurrency or run.concurrency, run.request_timeout_s, 2,
            server.ca_bundle,
        )  # fmt: skip

    return ask_group
