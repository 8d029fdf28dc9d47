"""vLLM's Prometheus /metrics text, parsed, and the speculative-decoding counters read from it.

Names checked against vLLM 0.32.0 (`vllm/v1/spec_decode/metrics.py`, class SpecDecodingProm):
counters `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and
`..._num_accepted_tokens_per_pos` (label `position` = 0..k-1), exported with the `_total` suffix and
labelled per engine (`model_name`, `engine`): a reading sums over engines.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import requests

log = logging.getLogger(__name__)

# the vLLM metrics this module reads, as vLLM names them (Prometheus adds _total to a counter);
# vllm_compat.py checks them in each supported release's wheel
VLLM_NAMES = (
    ("literal", "vllm/v1/spec_decode/metrics.py", "vllm:spec_decode_num_drafts"),
    ("literal", "vllm/v1/spec_decode/metrics.py", "vllm:spec_decode_num_draft_tokens"),
    ("literal", "vllm/v1/spec_decode/metrics.py", "vllm:spec_decode_num_accepted_tokens"),
    ("literal", "vllm/v1/spec_decode/metrics.py", "vllm:spec_decode_num_accepted_tokens_per_pos"),
)
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    """One line of the exposition format: a metric name, its labels and its value."""

    name: str
    labels: dict[str, str]
    value: float


def _parse_labels(text: str, line: str) -> dict[str, str]:
    labels, pos = {}, 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        if not match:
            raise ValueError(f"unreadable labels in /metrics line: {line!r}")
        labels[match.group(1)] = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], match.group(2))
        pos = match.end()
    return labels


def parse_prometheus(text: str) -> list[Sample]:
    """Parse the Prometheus text exposition format (comments and blank lines skipped).

    Raises:
        ValueError: a line that is neither a comment nor a sample, naming the line.
    """
    samples = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ValueError(f"unreadable /metrics line: {line!r}")
        labels = _parse_labels(match.group("labels") or "", line)
        samples.append(Sample(match.group("name"), labels, float(match.group("value"))))
    return samples


@dataclass(frozen=True)
class SpecDecodeCounters:
    """The spec-decode counters of one /metrics reading, summed over engines."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = field(default_factory=tuple)

    def minus(self, earlier: SpecDecodeCounters) -> SpecDecodeCounters:
        """Counter deltas since `earlier`; raises ValueError if a counter went down (restart)."""
        width = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        now = list(self.accepted_per_position) + [0] * (width - len(self.accepted_per_position))
        then = list(earlier.accepted_per_position) + [0] * (width - len(earlier.accepted_per_position))
        delta = SpecDecodeCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted_tokens - earlier.accepted_tokens,
            tuple(a - b for a, b in zip(now, then, strict=True)),
        )
        if min(delta.drafts, delta.draft_tokens, delta.accepted_tokens, *delta.accepted_per_position, 0) < 0:
            raise ValueError(
                "a vLLM spec-decode counter went down between two /metrics readings: the server restarted "
                "during the measurement; run the check again"
            )
        return delta


def spec_decode_counters(samples: list[Sample], model_name: str | None = None) -> SpecDecodeCounters:
    """Read the spec-decode counters from parsed samples (only `model_name`'s when given).

    Raises:
        ValueError: the server exports no spec-decode counters (speculative decoding is not on).
    """
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_pos: dict[int, float] = {}
    seen = False
    for sample in samples:
        if model_name is not None and sample.labels.get("model_name", model_name) != model_name:
            continue
        if sample.name in totals:
            totals[sample.name] += sample.value
            seen = True
        elif sample.name == ACCEPTED_PER_POS:
            position = int(sample.labels["position"])
            per_pos[position] = per_pos.get(position, 0.0) + sample.value
    if not seen:
        raise ValueError(
            f"/metrics has no {DRAFTS}: the server does not run speculative decoding "
            "(check its --speculative-config)"
        )
    positions = tuple(int(per_pos.get(i, 0.0)) for i in range(max(per_pos, default=-1) + 1))
    return SpecDecodeCounters(
        int(totals[DRAFTS]), int(totals[DRAFT_TOKENS]), int(totals[ACCEPTED]), positions
    )


def read_counters(
    base_url: str, timeout_s: float = 30.0, headers: dict | None = None, verify: bool | str = True
) -> SpecDecodeCounters:
    """GET {base_url}/metrics and read its spec-decode counters (`verify`: server.ca_bundle for https)."""
    response = requests.get(
        f"{base_url.rstrip('/')}/metrics", timeout=timeout_s, headers=headers, verify=verify
    )
    response.raise_for_status()
    return spec_decode_counters(parse_prometheus(response.text))
