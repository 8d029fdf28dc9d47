"""Keeping tokens and keys out of every file, log, param, error message and remote command line.

Four rules find a secret:
- by name: variables and flags named like secrets (HF_TOKEN, *_KEY(S), *_TOKEN(S), *SECRET*, *PASSWORD*,
  credentials, `--api-key`, `--hf-token`), in `NAME=value`, `--flag value`, `--flag=value` and
  `"name": "value"` forms, and every item of a list under such a name: `'name': ['v1', 'v2']` (vLLM's
  own args dump, whatever the key), `name=['v1']` (an argparse Namespace repr);
- by shape: Hugging Face (`hf_`), OpenAI-style (`sk-`), GitHub (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`,
  `github_pat_`) and AWS (`AKIA`, `ASIA`) tokens, `Bearer TOKEN`, `user:password@` and `:password@` in
  URLs, JWTs;
- by context: `X-API-Key:` and `Authorization: Basic` headers, `docker login -p`, `curl -u user:pass`,
  systemd's `SetCredential=ID:VALUE`;
- by value: every value the snapshot found under a secret name (or by shape) in the unit is
  remembered as a salted sha256 fingerprint (with its length), and any token of any text whose
  fingerprint matches is replaced, on token boundaries, so `8000` is hidden but `18000` is not.

Only fingerprints are shared between jobs, never values: the snapshot writes them into server.json
(`redaction`), and every job that can print server output (generation, serve check, stop) calls
`learn(server_json)` before it talks to the server. Structured output is redacted as a structure
(`redact_data`) before it is serialized; numbers are never redacted (a secret-named variable set to
`1` would otherwise hide every 1 of every file).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Mapping
from typing import Any

from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.vllm_flags import MULTI_VALUE_FLAGS

REDACTED = "<redacted>"
# A name holds a secret when it contains one of these words, with any prefix or suffix (HF_TOKEN2,
# GITHUBTOKEN, OPENAI_API_KEYS, DB_PASSWORD_OLD), once the words that only look alike are taken out.
_SECRET_PART = re.compile(
    r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|(?:^|_)(?:PASS|PWD|AUTH)(?:_|\d|$)"
)
_LOOKALIKES = re.compile(
    r"TOKENI[SZ]"  # TOKENIZER, TOKENIZERS_PARALLELISM
    r"|TOKENS(?=_|\d|$)|TOKEN_?(?:IDS?|THRESHOLD|BUDGET|COUNT|LIMIT|LEN|LENGTH)(?=_|\d|$)"  # counts
    r"|(?:MON|DON|HOC|TUR|WHIS)KEY|KEY(?:BOARD|WORD|STROKE|FRAME|SPACE|MAP)"
    r"|(?:KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?)_?(?:FILE|PATH|DIR)S?(?=_|\d|$)"  # where, not what
)
_NOT_SECRET_NAMES = frozenset({"KEY", "KEYS", "PWD", "OLDPWD"})


# Values shorter than this are hidden where they sit under a secret name, but not looked for in free
# text: a 3-character secret would otherwise erase every such word of every log.
MIN_SCRUB_LEN = 4
_PART_MIN_LEN = 8  # a multi-word secret's words are remembered on their own from this length
_WORD_CHAR = re.compile(r"[A-Za-z0-9_]")

_AUTH_SCHEMES = r"(?:basic|bearer|digest|token|negotiate|ntlm|apikey|aws4-hmac-sha256)"
# Secrets recognised by their shape alone. Each pattern's group 1 (when present) is kept.
_SHAPES = (
    re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}"),
    re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}"),
    re.compile(r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{30,}"),
    re.compile(r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,}"),
    re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])"),
    re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"),
    re.compile(r"(?i)(\bbearer(?:\s+|%20|\+))(?!<redacted>)[A-Za-z0-9._~+/=-]+"),
    # an Authorization header in any form: `Authorization: Basic X`, `authorization=Bearer%20X`
    # (OTEL_EXPORTER_OTLP_HEADERS), `Proxy-Authorization: X`; a header list goes on after a comma
    re.compile(
        rf"(?i)(\b(?:proxy-)?authorization\s*[:=]\s*(?:{_AUTH_SCHEMES}(?:\s+|%20|\+))?)"
        rf"(?!<redacted>)(?!{_AUTH_SCHEMES}(?:\s|%20|\+|$))[^\s,'\";&|]+"
    ),
    # URL userinfo: the password up to the authority's last `@` (`http://u:p@ss@proxy`), or a lone
    # user part that is a token (`https://ghp_...@github.com`, 20 characters or more)
    re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"]*:)(?!<redacted>@)[^/\s'\"]*(?=@[^/\s@'\"]*)"),
    re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(?!<redacted>@)[A-Za-z0-9._~%+-]{20,}(?=@)"),
    # by context: a header that carries a credential, `docker login -p`, `curl -u user:password`,
    # systemd's `SetCredential=ID:VALUE`
    re.compile(
        r"(?i)(\b(?:x-api-key|api-key|x-auth-token|x-goog-api-key|x-honeycomb-team|dd-api-key|"
        r"signoz-access-token|lightstep-access-token|x-sf-token)\s*[:=]\s*)(?!<redacted>)[^\s,'\";&|]+"
    ),
    re.compile(
        r"(\b(?:docker|podman|nerdctl|helm)\b[^\n;&|]*?\blogin\b[^\n;&|]*?\s(?:-p|--password)[\s=]+)"
        r"(?!<redacted>)[^\s'\"]+"
    ),  # fmt: skip
    re.compile(
        r"(\bcurl\b[^\n;&|]*?\s(?:-u|--user|--proxy-user)[\s=]*['\"]?[^\s:'\"]*:)(?!<redacted>)[^\s'\"]+"
    ),
    re.compile(r"(?m)(^\s*SetCredential(?:Encrypted)?=\s*[^:\s]+:)(?!<redacted>).+$"),
)
_NAME = r"[A-Za-z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|PASS|PWD|CREDENTIAL|AUTH)[A-Za-z0-9_]*"
# quoted strings as shells and Python's repr write them (a backslash escapes the next character)
_DQ, _SQ = r'"(?:[^"\\\n]|\\.)*"', r"'(?:[^'\\\n]|\\.)*'"
# an unquoted value ends before a shell operator, and a trailing `,` or `)` (a repr's) is not part of
# it; a list is _LIST_VALUE's
_BARE = r"""[^\s"'\[;&|](?:[^\s"';&|]*[^\s"',);&|])?"""
_ASSIGNMENT = re.compile(rf"""(?P<name>\b{_NAME})=(?P<value>{_DQ}|{_SQ}|{_BARE})""", re.IGNORECASE)
_FLAG_VALUE = re.compile(
    rf"""(?P<flag>--[A-Za-z0-9_-]+)(?P<sep>=|\s+)(?P<value>{_DQ}|{_SQ}|[^\s"'\\-][^\s"']*)"""
)
# a flag that takes several values (`--api-key k1 k2`, vLLM's nargs='+'): every word up to the next
# flag, across a unit's backslash-newline continuations, but not past a shell operator
_VALUE_WORD = rf"""(?:{_DQ}|{_SQ}|[^\s"'\\;&|<>()-][^\s"';&|<>()]*)"""
_GAP = r"(?:[ \t]|\\\r?\n)+"
_MULTI_FLAG = re.compile(
    rf"(?P<flag>--[A-Za-z0-9_-]+)(?P<gap>{_GAP})(?P<values>{_VALUE_WORD}(?:{_GAP}{_VALUE_WORD})*)"
)
_KEY_VALUE = re.compile(
    rf"""(?P<q>["'])(?P<name>-*{_NAME})(?P=q)(?P<sep>\s*:\s*\[?\s*)(?P<value>{_DQ}|{_SQ})""",
    re.IGNORECASE,
)
# a secret-named key or attribute holding a list, in any dump: `'api_key': ['k1', 'k2']` (vLLM's
# non-default args), `"API_KEYS": [...]` (JSON), `api_key=['k1']` (an argparse Namespace repr): every
# item, quotes and escapes read as Python writes them (a `]` or `,` inside a key stays inside it)
_LIST_VALUE = re.compile(
    rf"""(?P<head>(?<![A-Za-z0-9_-])(?P<q>["']?)(?P<name>-*{_NAME})(?P=q)\s*[:=]\s*\[)(?P<items>(?:{_DQ}|{_SQ}|[^\]\n'"])*)\]""",
    re.IGNORECASE,
)
_LIST_ITEM = re.compile(rf"""{_DQ}|{_SQ}|[^\s,"'\[\]]+""")
_NOT_VALUES = frozenset({"", "None", "null", "True", "False", "true", "false", "[]", "{}", "''", '""'})
# `Basic X` where X is base64 of `user:password` (the shape itself: no header name needed)
_BASIC = re.compile(r"(?i)(\bbasic(?:\s+|%20|\+))(?!<redacted>)([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])")


def is_secret_name(name: str) -> bool:
    """True for environment variable or flag names that hold secrets (`--api-key`, `HF_TOKEN`,
    `HF_TOKEN2`); not for the names that only look alike (`--tokenizer`, `MAX_TOKENS`, `SSL_KEYFILE`:
    a path is not the secret)."""
    upper = name.lstrip("-").replace("-", "_").replace(".", "_").upper()
    if upper in _NOT_SECRET_NAMES:
        return False
    return bool(_SECRET_PART.search(_LOOKALIKES.sub("_", upper)))


def unit_salt(source_host: str, unit: str) -> str:
    """The fingerprints' salt for one deployment: fixed, so that an unchanged server re-snapshots to
    identical files, and distinct per host and unit, so that no table precomputed for another
    deployment applies. (A guessable secret stays guessable from any hash: server.json is as private
    as the results folder.)"""
    return hashlib.sha256(f"eagle3-pipeline redaction\0{source_host}\0{unit}".encode()).hexdigest()[:32]


def _fingerprint(salt: str, value: str) -> str:
    return hashlib.sha256(f"{salt}\0{value}".encode()).hexdigest()


class Redactor:
    """Secret fingerprints (never the values) and the text and structure scrubbers that use them."""

    def __init__(self, salt: str = "") -> None:
        self.salt = salt
        self._own: set[tuple[int, str]] = set()  # (length, fingerprint) under self.salt
        self._known: dict[str, dict[int, set[str]]] = {}  # salt -> length -> fingerprints

    def add(self, value: object) -> None:
        """Remember a secret value (and each long word or list item of it) by fingerprint."""
        if not isinstance(value, str) or not value or value == REDACTED:
            return
        parts = re.split(r"[\s,;]+", value)  # a list of keys (OPENAI_API_KEYS=a,b): each one alone too
        for item in {value, *(part for part in parts if len(part) >= _PART_MIN_LEN)}:
            entry = (len(item), _fingerprint(self.salt, item))
            self._own.add(entry)
            self._known.setdefault(self.salt, {}).setdefault(entry[0], set()).add(entry[1])

    def export(self) -> dict[str, Any]:
        """This redactor's own fingerprints, for server.json: `{"salt", "fingerprints": ["LEN:SHA256"]}`."""
        return {"salt": self.salt, "fingerprints": sorted(f"{n}:{h}" for n, h in self._own)}

    def export_known(self) -> list[dict[str, Any]]:
        """Every fingerprint this redactor knows (its own and learned ones), one table per salt, for a
        process that scrubs on its behalf (`log_filter`)."""
        return [
            {
                "salt": salt,
                "fingerprints": sorted(f"{n}:{h}" for n, digests in table.items() for h in digests),
            }
            for salt, table in self._known.items()
        ]

    def learn(self, redaction: dict[str, Any] | None) -> None:
        """Take in fingerprints exported by another process (server.json's `redaction`)."""
        if not redaction:
            return
        table = self._known.setdefault(str(redaction.get("salt", "")), {})
        for item in redaction.get("fingerprints", []):
            length, _, digest = str(item).partition(":")
            if length.isdigit() and digest:
                table.setdefault(int(length), set()).add(digest)

    def merge(self, other: Redactor) -> None:
        """Take in everything `other` knows."""
        for salt, table in other._known.items():
            mine = self._known.setdefault(salt, {})
            for length, digests in table.items():
                mine.setdefault(length, set()).update(digests)

    def scrub(self, text: str) -> str:
        """`text` with every secret (by shape, by name and by fingerprint) replaced by `<redacted>`.
        Nothing is remembered: a log line saying `--api-key is required` must not make `is` a secret."""
        return self.scrub_known(scrub_patterns(text))

    def scrub_known(self, text: str) -> str:
        """`text` with every remembered value replaced, where it stands as a whole token."""
        tables = [
            (hashlib.sha256(f"{salt}\0".encode()), table)
            for salt, table in self._known.items()
            if any(n >= MIN_SCRUB_LEN for n in table)
        ]
        lengths = sorted({n for _, table in tables for n in table if n >= MIN_SCRUB_LEN}, reverse=True)
        if not lengths or not text:
            return text
        bounds = _boundaries(text)
        out, start = [], 0
        for i in sorted(bounds):
            if i < start:
                continue
            for n in lengths:  # longest first, so a secret inside a longer one never wins
                if i + n in bounds and _known_in(tables, n, text[i : i + n]):
                    out += [text[start:i], REDACTED]
                    start = i + n
                    break
        out.append(text[start:])
        return "".join(out)


def _known_in(tables: list[tuple[Any, dict[int, set[str]]]], length: int, value: str) -> bool:
    data = value.encode()
    for base, table in tables:
        digests = table.get(length)
        if digests:
            hasher = base.copy()
            hasher.update(data)
            if hasher.hexdigest() in digests:
                return True
    return False


def _boundaries(text: str) -> set[int]:
    """Token boundaries: positions not between two word characters (`8000` stands alone in `:8000/`,
    not in `18000`)."""
    word = [bool(_WORD_CHAR.match(c)) for c in text]
    return {0, len(text)} | {i for i in range(1, len(text)) if not (word[i - 1] and word[i])}


def scrub_patterns(text: str, redactor: Redactor | None = None) -> str:
    """`text` with secrets found by shape and by name replaced; each value found is added to
    `redactor` (when given), so that it is also hidden where it appears alone."""

    def shape(match: re.Match[str]) -> str:
        keep = (match.group(1) or "") if match.re.groups else ""
        value = match.group(0)[len(keep) :]
        if redactor is not None and len(value) >= _PART_MIN_LEN:  # not the word after a prose "bearer"
            redactor.add(value)
        return keep + REDACTED

    def named(match: re.Match[str]) -> str:
        name = match.group("name") if "name" in match.re.groupindex else match.group("flag")
        value = _unquote(match.group("value"))
        if not is_secret_name(name) or value.startswith("$") or value == REDACTED or value in _NOT_VALUES:
            return match.group(0)  # a reference such as $VLLM_API_KEY is no secret
        if redactor is not None:
            redactor.add(value)
        quote = match.group("value")[0] if match.group("value")[0] in "\"'" else ""
        head = match.group(0)[: match.start("value") - match.start(0)]
        return f"{head}{quote}{REDACTED}{quote}"

    def several(match: re.Match[str]) -> str:
        flag = "--" + match.group("flag")[2:].replace("_", "-")
        if flag not in MULTI_VALUE_FLAGS or not is_secret_name(flag):
            return match.group(0)
        return (
            match.group("flag") + match.group("gap") + re.sub(_VALUE_WORD, hide_item, match.group("values"))
        )

    def hide_item(found: re.Match[str]) -> str:
        value, quote = _unquote(found.group(0)), found.group(0)[0] if found.group(0)[0] in "\"'" else ""
        if value in _NOT_VALUES or value == REDACTED or value.startswith("$"):
            return found.group(0)
        if redactor is not None:
            redactor.add(value)
        return f"{quote}{REDACTED}{quote}"

    def basic(match: re.Match[str]) -> str:
        try:
            decoded = base64.b64decode(match.group(2) + "=" * (-len(match.group(2)) % 4), validate=True)
        except ValueError:
            return match.group(0)
        if b":" not in decoded:  # not user:password: the word "Basic" in prose
            return match.group(0)
        if redactor is not None:
            redactor.add(match.group(2))
        return match.group(1) + REDACTED

    def listed(match: re.Match[str]) -> str:
        if not is_secret_name(match.group("name")):
            return match.group(0)
        return f"{match.group('head')}{_LIST_ITEM.sub(hide_item, match.group('items'))}]"

    for pattern in _SHAPES:
        text = pattern.sub(shape, text)
    text = _BASIC.sub(basic, text)
    text = _LIST_VALUE.sub(listed, text)  # before the scalar forms, which would take `[` for the value
    text = _MULTI_FLAG.sub(several, text)  # before the one-value form, which would stop at the first
    for pattern in (_ASSIGNMENT, _KEY_VALUE, _FLAG_VALUE):
        text = pattern.sub(named, text)
    return text


def _unquote(word: str) -> str:
    """A quoted word's content (a backslash escape undone); an unquoted word as it is."""
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "\"'":
        return re.sub(r"\\(.)", r"\1", word[1:-1])
    return word


REDACTOR = Redactor()


def learn(snapshot: ServerSnapshot | Mapping[str, Any], redactor: Redactor = REDACTOR) -> None:
    """Make this process hide the secrets of the unit a server.json describes (its `redaction`
    fingerprints). Call it in every job that reads server.json and can print server output."""
    redactor.learn(ServerSnapshot.of(snapshot).redaction)


def redact_env(env: dict[str, str], redactor: Redactor = REDACTOR) -> dict[str, str]:
    """Environment with secret values replaced (and remembered): a secret-named variable's whole
    value, and in any other value the secrets found by shape (an `Authorization=Basic ...` header in
    OTEL_EXPORTER_OTLP_HEADERS, a proxy URL's password)."""
    out = {}
    for name, value in env.items():
        if is_secret_name(name):
            redactor.add(value)
            out[name] = REDACTED
        else:
            out[name] = scrub_patterns(value, redactor)
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


def redact_unit_text(text: str, redactor: Redactor = REDACTOR) -> str:
    """A unit file's text with secret assignments, secret flag values, token shapes and every
    remembered value replaced; each value found is remembered (the snapshot's collecting pass)."""
    return redactor.scrub_known(scrub_patterns(text, redactor))


def redact_data(data: Any, redactor: Redactor = REDACTOR) -> Any:
    """A copy of a JSON-like structure with secrets replaced, for writing as JSON: strings are
    scrubbed and strings under a secret-named key replaced; numbers are kept as they are (the file
    stays valid JSON, unlike a substring edit of its text)."""
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            name_hides = isinstance(key, str) and is_secret_name(key) and _is_text(value)
            out[redactor.scrub(key) if isinstance(key, str) else key] = (
                _hide(value) if name_hides else redact_data(value, redactor)
            )
        return out
    if isinstance(data, list | tuple):
        return [redact_data(item, redactor) for item in data]
    if isinstance(data, str):
        return redactor.scrub(data)
    return data  # a number is never redacted: a secret such as `1` must not hide a tensor-parallel size


def _is_text(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    )


def _hide(value: Any) -> Any:
    return [REDACTED for _ in value] if isinstance(value, list) else REDACTED


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
