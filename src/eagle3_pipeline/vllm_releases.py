"""The vLLM releases the pipeline supports, per use, and what a release outside them means.

Three uses reach vLLM, each through other parts of it:

    serve    the served unit: its command line (server/vllm_args.py), the OpenAI HTTP API, /metrics
    extract  the extraction engine (hidden_states/vllm_worker.py): vLLM's offline LLM, its KV connector
             subclassed, its engine config read back
    export   the exported draft as vLLM loads it (draft/export.py): config keys, architecture names,
             the speculators folder served as `vllm serve FOLDER`

Each range is [low, high) over (major, minor) and is what the compatibility check (vllm_compat.py,
`make vllm-compat`) reads in each release's own wheel. A version outside a range is reported before
any GPU work (the snapshot, and the extraction engine's interpreter before it starts): a warning for
serve and export, which use vLLM's public interfaces that stayed the same over every checked release;
an error for extract, whose internals changed (0.34 removed the V1 model runner), unless its override
is set.

Stdlib only: the extraction engine's interpreter (vLLM's, without the pipeline's packages) imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# the releases whose wheels the compatibility check reads (make vllm-compat; README, Tests)
CHECKED_RELEASES = ("0.32.0", "0.33.0", "0.34.0")


@dataclass(frozen=True)
class SupportedRange:
    """The vLLM releases one use of vLLM was checked against: [low, high) over (major, minor)."""

    use: str
    low: tuple[int, int]
    high: tuple[int, int]
    what: str  # what of vLLM the use relies on, for the messages
    override: str | None = None  # set: outside the range is an error unless this setting is true

    @property
    def spec(self) -> str:
        """The range as a version specifier, e.g. `>=0.32,<0.35`."""
        return f">={self.low[0]}.{self.low[1]},<{self.high[0]}.{self.high[1]}"

    def contains(self, version: str) -> bool | None:
        """True inside the range, False outside, None for a version that does not parse."""
        release = major_minor(version)
        return None if release is None else self.low <= release < self.high


RANGES = {
    r.use: r
    for r in (
        SupportedRange("serve", (0, 32), (0, 35), "its command-line flags, OpenAI HTTP API and /metrics"),
        SupportedRange("export", (0, 32), (0, 35), "its draft loaders' config keys and architecture names"),
        SupportedRange(
            "extract",
            (0, 32),
            (0, 35),
            "its internals (the hidden-state KV connector subclassed, the engine's config read back)",
            override="hidden_states.vllm.allow_untested_version",
        ),
    )
}


class UnsupportedVllmError(RuntimeError):
    """A vLLM outside the range of a use whose internals changed; the message names the override."""


def major_minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string such as 0.34.0, 0.33.1rc2 or 0.32.0+cpu; None if none."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else None


def check(use: str, version: str | None, allow_outside: bool = False) -> str | None:
    """Report `version` against the range of `use`: None inside it (or unknown), else a warning.

    Returns:
        The warning for a version outside the range (or one that does not parse), for the caller to
        log or record, else None.

    Raises:
        UnsupportedVllmError: outside the range of a use with an override that is not set.
    """
    if not version:
        return None  # a source checkout without metadata: the engine records what ran
    supported = RANGES[use]
    inside = supported.contains(version)
    if inside:
        return None
    where = "is outside the range" if inside is False else "cannot be compared with the range"
    message = f"vLLM {version} {where} the pipeline's {use} was checked with ({supported.spec}: "
    message += f"{supported.what})"
    if supported.override and not allow_outside:
        raise UnsupportedVllmError(
            f"{message}, which change between releases. Use a vLLM in that range, or set "
            f"{supported.override}: true to run it anyway"
        )
    return f"{message}; {f'{supported.override}: true' if supported.override else 'going on'}"


# Run-time-only environment a release refuses at start (vllm/platforms/interface.py, validate_environ):
# name -> (first release that refuses it, the values it still takes, why). Dropped from the engine's
# environment with a warning: it picks how vLLM runs, never what it computes.
REFUSED_ENV = {
    "VLLM_USE_V2_MODEL_RUNNER": ((0, 34), frozenset({"1"}), "0.34 removed the V1 model runner"),
}


def refused_env(version: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that vLLM `version` refuses at start, each with why (REFUSED_ENV)."""
    release = major_minor(version)
    if release is None:
        return {}
    return {
        name: why
        for name, (since, accepted, why) in REFUSED_ENV.items()
        if name in env and release >= since and env[name] not in accepted
    }
