"""The production drop-in's marker, path and signal handling, without a host."""

from __future__ import annotations

import os
import signal

import pytest

from eagle3_pipeline.server.dropin import ServeCheckError, dropin_path, dropin_text, parse_marker
from eagle3_pipeline.server.interrupts import Interrupted, deferred_interrupts, interrupts_as_exceptions
from eagle3_pipeline.server.unit import merge_unit, split_words
from eagle3_pipeline.validate.remote_checkpoint import unit_sandbox


def test_marker_round_trips_and_systemd_reads_the_rest():
    text = dropin_text('"/usr/bin/vllm" "serve" "/m"', "20261201T120000-abcd1234", was_active=False)
    assert parse_marker(text) == {"run": "20261201T120000-abcd1234", "was_active": False}
    unit = merge_unit([("/u.service", "[Service]\nExecStart=/old\n"), ("/d.conf", text)], "u.service")
    assert [split_words(c.raw, "t") for c in unit.exec_start] == [["/usr/bin/vllm", "serve", "/m"]]
    assert parse_marker("[Service]\nExecStart=/x\n") is None
    assert parse_marker("# Written by eagle3-pipeline's serve_check; removed when the check ends.\n")[
        "run"
    ] == ("legacy")


def test_dropin_goes_to_the_runtime_folder_and_unit_names_are_checked():
    assert dropin_path("vllm.service") == "/run/systemd/system/vllm.service.d/zz-eagle3-serve-check.conf"
    for bad in ("../../etc/passwd.service", "vllm", "a/b.service", ".service"):
        with pytest.raises(ServeCheckError, match="not a NAME.service"):
            dropin_path(bad)


def test_sigterm_and_sigint_become_exceptions_then_handlers_are_put_back():
    before = signal.getsignal(signal.SIGTERM)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with pytest.raises(Interrupted) as info, interrupts_as_exceptions():
            os.kill(os.getpid(), sig)
            signal.pause()
        assert info.value.signum == sig
    assert signal.getsignal(signal.SIGTERM) is before


def test_signals_during_the_restore_are_deferred():
    with deferred_interrupts() as received:
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process without the deferral
    assert received == [signal.SIGTERM]


def test_unit_sandbox_reads_user_private_tmp_and_protect_home_after_dropins():
    cat = (
        "# /etc/systemd/system/v.service\n[Service]\nUser=vllm\nPrivateTmp=yes\nExecStart=/x\n"
        "# /etc/systemd/system/v.service.d/o.conf\n[Service]\nPrivateTmp=no\nProtectHome=read-only\n"
    )
    sandbox = unit_sandbox(cat, "v.service")
    assert (sandbox.user, sandbox.private_tmp, sandbox.protect_home) == ("vllm", False, "read-only")


def test_the_serve_check_rule_turns_sigterm_into_an_exception():
    """serve_check (the rule's entry) runs under interrupts_as_exceptions, also as a decorator."""
    from eagle3_pipeline.validate.serve_check import serve_check

    @interrupts_as_exceptions()
    def job() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()

    for _ in range(2):  # a fresh context per call
        with pytest.raises(Interrupted):
            job()
    assert hasattr(serve_check, "__wrapped__")


def test_dropin_text_travels_on_stdin_byte_for_byte(tmp_path):
    """The drop-in goes to `tee` on stdin, never on a command line (where `ps` would show it)."""
    from eagle3_pipeline.server.remote import LocalHost

    text = dropin_text('"/usr/bin/vllm" "serve" "/m" "--api-key" "$KEY" "100%%"', "r", True)
    target = tmp_path / "d.conf"
    assert LocalHost().run(f"tee -- {target} >/dev/null", stdin=text).ok
    assert target.read_text() == text
