"""The draft's command (draft_command.draft_argv, what the check unit runs) is refused before anything
on the host changes when it cannot work (so production is never stopped for it), and specifiers are
carried as systemd made the words."""

from __future__ import annotations

import pytest

from eagle3_pipeline.server.draft_command import ServeCheckError, draft_argv, vllm_exec
from eagle3_pipeline.server.unit import merge_unit


def _exec(line: str, unit: str = "vllm.service"):
    return vllm_exec(f"# /etc/systemd/system/{unit}\n[Service]\nExecStart={line}\n", unit)


def _draft(line: str, unit: str = "vllm.service", checkpoint: str = "/srv/e3/run1") -> list[str]:
    return draft_argv(_exec(line, unit), checkpoint, 3, False)


def test_a_specifier_the_snapshot_cannot_resolve_is_refused():
    """`%h` is systemd's to resolve, and the check unit's argv carries no specifiers: the draft would load
    /%h/models."""
    with pytest.raises(ServeCheckError, match=r"specifiers.*%h.*nothing was changed"):
        _draft("/usr/bin/vllm serve %h/models/kimi")


def test_an_instance_with_a_space_stays_one_word():
    r"""`%I` of vllm@my\x20model.service is `my model`, one word for systemd: so in the draft's command
    too."""
    words = _draft("/usr/bin/vllm serve /models/%I --port 8000", unit="vllm@my\\x20model.service")
    assert words[:3] == ["/usr/bin/vllm", "serve", "/models/my model"]
    unit = merge_unit([("d.conf", '[Service]\nExecStart=\nExecStart=/x "100%%"\n')], "u.service")
    assert unit.exec_start[0].words == ["/x", "100%"]  # `%%` is a literal percent, never a specifier


def test_a_container_that_does_not_mount_the_draft_is_refused():
    line = "/usr/bin/docker run --rm -v /srv/models:/models registry/vllm:1 vllm serve /models/kimi"
    with pytest.raises(ServeCheckError, match=r"does not mount /srv/e3/run1.*/srv/models"):
        _draft(line)


def test_a_container_sees_the_draft_through_its_mount():
    line = "/usr/bin/docker run --rm -v /srv/e3:/drafts registry/vllm:1 vllm serve /models/kimi"
    words = _draft(line)
    spec = words[words.index("--speculative-config") + 1]
    assert '"model":"/drafts/run1"' in spec
