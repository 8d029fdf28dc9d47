"""Keeping tokens and keys out of every file, log, param and error message.

Secret names: HF_TOKEN, *_KEY, *_TOKEN, *SECRET*, *PASSWORD*, credentials; secret flags: `--api-key`,
`--hf-token` and any flag with such a name. Every secret value met while parsing is remembered by a
`Redactor`, which scrubs it from text; a logging filter applies it to every record (message and
traceback) before a handler writes it.
"""

from __future__ import annotations

import logging
import re

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(
    r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS|PWD|CREDENTIALS?|APIKEY|AUTH)(_|$)|SECRET|PASSWORD|^HF_TOKEN$"
)
_URL_CREDENTIALS = re.compile(r"(://[^/\s:@]+:)[^/\s@]+@")
_MIN_SCRUB_LEN = 4  # shorter values would scrub ordinary words; structured redaction still hides them


def is_secret_name(name: str) -> bool:
    """True for environment variable or flag names that hold secrets (`--api-key`, `HF_TOKEN`)."""
    return bool(_SECRET_NAME.search(name.lstrip("-").replace("-", "_").upper()))


class Redactor:
    """Remembers secret values and replaces them in any text."""

    def __init__(self) -> None:
        self.values: set[str] = set()

    def add(self, value: object) -> None:
        if isinstance(value, str) and value and value != REDACTED:
            self.values.add(value)
            self.values.update(part for part in value.split() if len(part) >= _MIN_SCRUB_LEN)

    def scrub(self, text: str) -> str:
        for value in sorted(self.values, key=len, reverse=True):
            if len(value) >= _MIN_SCRUB_LEN or value == text:
                text = text.replace(value, REDACTED)
        return _URL_CREDENTIALS.sub(r"\1" + REDACTED + "@", text)


REDACTOR = Redactor()


def redact_env(env: dict[str, str], redactor: Redactor = REDACTOR) -> dict[str, str]:
    """Environment with secret values replaced (and remembered)."""
    out = {}
    for name, value in env.items():
        if is_secret_name(name):
            redactor.add(value)
            out[name] = REDACTED
        else:
            out[name] = value
    return out


def redact_flags(flags: dict[str, object], redactor: Redactor = REDACTOR) -> dict[str, object]:
    """vLLM flags with secret values replaced (and remembered); booleans are kept."""
    out: dict[str, object] = {}
    for name, value in flags.items():
        if is_secret_name(name) and not isinstance(value, bool):
            for item in value if isinstance(value, list) else [value]:
                redactor.add(item)
            out[name] = REDACTED
        else:
            out[name] = value
    return out


_ASSIGNMENT = re.compile(
    r"""(?P<name>\b[A-Za-z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS|PWD|CREDENTIAL|AUTH)[A-Za-z0-9_]*)"""
    r"""=(?P<value>"[^"]*"|'[^']*'|[^\s"']+)""",
    re.IGNORECASE,
)
_FLAG_VALUE = re.compile(
    r"""(?P<flag>--[A-Za-z0-9_-]+)(?P<sep>=|\s+)(?P<value>"[^"]*"|'[^']*'|[^\s"'\\-][^\s"']*)"""
)


def redact_unit_text(text: str, redactor: Redactor = REDACTOR) -> str:
    """A unit file's text with secret assignments, secret flag values and known values replaced."""

    def assignment(match: re.Match[str]) -> str:
        if not is_secret_name(match.group("name")) or match.group("value").lstrip("\"'").startswith("$"):
            return match.group(0)
        redactor.add(match.group("value").strip("\"'"))
        return f"{match.group('name')}={REDACTED}"

    def flag(match: re.Match[str]) -> str:
        if not is_secret_name(match.group("flag")) or match.group("value").lstrip("\"'").startswith("$"):
            return match.group(0)
        redactor.add(match.group("value").strip("\"'"))
        return f"{match.group('flag')}{match.group('sep')}{REDACTED}"

    text = _FLAG_VALUE.sub(flag, _ASSIGNMENT.sub(assignment, text))
    return redactor.scrub(text)


class RedactingFilter(logging.Filter):
    """Scrubs secrets from a record's message and traceback before any handler writes it."""

    def __init__(self, redactor: Redactor = REDACTOR) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redactor.scrub(record.getMessage())
        record.args = ()
        if record.exc_info:
            record.exc_text = self.redactor.scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def protect_logging(redactor: Redactor = REDACTOR) -> None:
    """Add the redacting filter to every handler of the root logger (call after configuring it)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter(redactor))
