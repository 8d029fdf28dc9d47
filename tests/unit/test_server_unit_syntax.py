"""The unit parser against systemd's own rules (conf-parser.c, extract-word.c, escape.c,
load-fragment.c, unit-name.c): each case is one place where a naive parser differs from systemd."""

from __future__ import annotations

import pytest

from eagle3_pipeline.server.unit import command_argv, merge_unit
from eagle3_pipeline.server.unit_syntax import (
    UnitError,
    extract_words,
    name_specifiers,
    split_words,
    unit_lines,
)


def _unit(text: str, name: str = "vllm.service"):
    return merge_unit([("/etc/systemd/system/" + name, text)], name)


@pytest.mark.parametrize(
    ("escaped", "plain"),
    [
        (r"a\x2db", "a-b"),  # hex
        (r"a\055b", "a-b"),  # octal
        (r"caf\u00e9", "café"),  # 4-digit code point
        (r"\U0001F600", "\U0001f600"),  # 8-digit code point
        (r"\xc3\xa9", "é"),  # \xNN are bytes: two of them make one UTF-8 character
        (r"a\tb\nc", "a\tb\nc"),
        (r"a\sb", "a b"),  # \s is a space, inside the word
        (r"'a\x20b'", "a b"),  # escapes are decoded inside single quotes too
        (r"\w+", r"\w+"),  # unknown: kept verbatim (systemd's relaxed retry, with a warning)
        (r"\x00", r"\x00"),  # NUL is refused, so kept verbatim
    ],
)
def test_c_escapes_in_exec_start(escaped: str, plain: str) -> None:
    assert split_words(f"/bin/x {escaped}", "t")[1] == plain


def test_escapes_in_environment() -> None:
    unit = _unit('[Service]\nEnvironment="A=x\\x3dy" B=\\u00e9\\101\n')
    assert unit.environment == {"A": "x=y", "B": "éA"}


def test_unknown_escape_ends_an_environment_line() -> None:
    """systemd keeps the words before the bad one and ignores the rest of the line, with a warning."""
    unit = _unit("[Service]\nEnvironment=A=1 B=\\q C=3\n")
    assert unit.environment == {"A": "1"}
    assert "unknown escape \\q" in unit.warnings[0]
    with pytest.raises(UnitError) as info:
        extract_words("A=1 B=\\q C=3", "t", relax=False)
    assert info.value.words == ["A=1"]


def test_instance_specifiers_unescape() -> None:
    spec = name_specifiers(r"vllm@models-kimi\x2dk2.service")
    assert spec["i"] == r"models-kimi\x2dk2"
    assert spec["I"] == "models/kimi-k2"
    assert spec["f"] == "/models/kimi-k2"
    assert (spec["p"], spec["N"], spec["n"]) == (
        "vllm",
        r"vllm@models-kimi\x2dk2",
        r"vllm@models-kimi\x2dk2.service",
    )


def test_specifiers_are_resolved_after_quotes_are_removed() -> None:
    """`%I` holding a space stays one word: systemd splits words first, then resolves specifiers."""
    unit = _unit("[Service]\nExecStart=/bin/vllm serve /%I --name %I\n", r"vllm@m\x20x.service")
    assert command_argv(unit.exec_start[0], {}, []) == ["/bin/vllm", "serve", "/m x", "--name", "m x"]
    env_unit = _unit("[Service]\nEnvironment=MODEL=%I\n", r"vllm@m\x20x.service")
    assert env_unit.environment == {"MODEL": "m x"}


def test_empty_environment_resets_the_list() -> None:
    unit = _unit("[Service]\nEnvironment=A=1\nEnvironment=\nEnvironment=B=2\n")
    assert unit.environment == {"B": "2"}


def test_environment_word_without_equals_is_ignored_with_a_warning() -> None:
    unit = _unit("[Service]\nEnvironment=A=1 JUSTANAME B=2\n")
    assert unit.environment == {"A": "1", "B": "2"}
    assert unit.warnings == [
        "Environment= in /etc/systemd/system/vllm.service: 'JUSTANAME' is not a NAME=VALUE assignment; "
        "systemd ignores it"
    ]


def test_escaped_backslash_at_line_end_does_not_continue() -> None:
    lines = unit_lines("ExecStart=/bin/x a\\\\\nUser=u\nExecStart=/bin/y \\\n  b\n")
    assert [line for _, line in lines] == ["ExecStart=/bin/x a\\\\", "User=u", "ExecStart=/bin/y    b"]


def test_backslash_then_trailing_space_does_not_continue() -> None:
    assert [line for _, line in unit_lines("A=x \\ \nB=y\n")] == ["A=x \\", "B=y"]


def test_whitespace_inside_quotes_across_continuation_lines() -> None:
    """The backslash becomes one space and the next line comes as it is, indentation included."""
    unit = _unit('[Service]\nExecStart=/bin/x --name "a \\\n    b" --c \\\n# comment\n  d\n')
    assert command_argv(unit.exec_start[0], {}, []) == ["/bin/x", "--name", "a      b", "--c", "d"]
