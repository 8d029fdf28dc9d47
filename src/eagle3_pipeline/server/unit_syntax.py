r"""systemd's syntax for unit files, as systemd reads it: lines, words, C escapes and specifiers.

Followed from systemd's own sources (src/shared/conf-parser.c, src/basic/extract-word.c,
src/basic/escape.c `cunescape_one`, src/core/load-fragment.c `config_parse_exec` and
`config_parse_environ`, src/basic/unit-name.c `unit_name_unescape`):

- A line whose last character is an unescaped backslash continues on the next line: the backslash
  becomes a space and the next line is appended as it is, leading whitespace included (so whitespace
  inside quotes across lines is kept); a line ending in `\\` (an escaped backslash) does not continue.
  Comment lines inside a continuation are skipped.
- Words: whitespace separates them; single and double quotes group, anywhere in a word; C escapes
  (`\a \b \f \n \r \t \v \\ \" \' \s`, `\xNN`, octal `\NNN`, `\uNNNN`, `\UNNNNNNNN`) are
  decoded inside and outside quotes, `\xNN` and octal as raw bytes. An unknown escape is kept
  verbatim with a warning in ExecStart= (systemd retries relaxed) and ends the line in Environment=
  (systemd ignores the rest).
- Specifiers are resolved per word, after quotes and escapes are removed (so `%I` that holds a space
  stays one word); `%I`, `%P`, `%J` and `%f` unescape (`-` is `/`, `\xNN` a byte).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SIMPLE_ESCAPES = {
    "a": b"\a", "b": b"\b", "f": b"\f", "n": b"\n", "r": b"\r", "t": b"\t", "v": b"\v",
    "\\": b"\\", '"': b'"', "'": b"'", "s": b" ",
}  # fmt: skip
_HEX = re.compile(r"[0-9A-Fa-f]+")


class UnitError(ValueError):
    """A unit that cannot be read: the message names the file and line. `words` holds the words
    read before the problem (systemd keeps them where it ignores only the rest of the line)."""

    def __init__(self, message: str, words: list[str] | None = None) -> None:
        super().__init__(message)
        self.words = words or []


@dataclass(frozen=True)
class Unresolved:
    """Something the snapshot could not determine, and why."""

    what: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"what": self.what, "why": self.why}


def unit_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, logical line) pairs, joined the way systemd's config parser joins them;
    comment and blank lines are left out and each logical line is stripped."""
    out: list[tuple[int, str]] = []
    pending: str | None = None
    start = 0
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.lstrip().startswith(("#", ";")):
            continue  # a comment, also inside a continuation
        if pending is None:
            start = number
        joined = line if pending is None else pending + line
        if _ends_with_escape(joined):
            pending = joined[:-1] + " "
            continue
        pending = None
        if joined.strip():
            out.append((start, joined.strip()))
    if pending is not None and pending.strip():
        out.append((start, pending.strip()))
    return out


def _ends_with_escape(text: str) -> bool:
    """True when the last character is a backslash that no other backslash escapes."""
    trailing = len(text) - len(text.rstrip("\\"))
    return trailing % 2 == 1


def cunescape_one(text: str, i: int) -> tuple[bytes, int] | None:
    """Decode the escape whose letter is text[i] (after a backslash): (bytes, characters used), or
    None when systemd refuses it (unknown letter, short or NUL `\\x`/octal/`\\u`, octal above 255)."""
    letter = text[i] if i < len(text) else ""
    if letter in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[letter], 1
    if letter in ("x", "u", "U"):
        size = {"x": 2, "u": 4, "U": 8}[letter]
        digits = text[i + 1 : i + 1 + size]
        if len(digits) != size or not _HEX.fullmatch(digits) or int(digits, 16) == 0:
            return None
        value = int(digits, 16)
        if letter == "x":
            return bytes([value]), 1 + size
        if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            return None
        return chr(value).encode(), 1 + size
    if "0" <= letter <= "7":
        digits = text[i : i + 3]
        if len(digits) != 3 or any(not "0" <= d <= "7" for d in digits):
            return None
        value = int(digits, 8)
        return (bytes([value]), 3) if 0 < value <= 255 else None
    return None


def extract_words(text: str, where: str, relax: bool, warnings: list[str] | None = None) -> list[str]:
    """Split `text` into words as systemd's extract_first_word(UNQUOTE|CUNESCAPE) does.

    Args:
        text: the value after `Key=`.
        where: names the file and key in errors and warnings.
        relax: keep unknown escapes verbatim with a warning (ExecStart=); else raise UnitError.
        warnings: where relaxed escapes are reported.

    Raises:
        UnitError: unbalanced quotes, or an unknown escape when not relaxed.
    """
    words: list[str] = []
    current = bytearray()
    in_word, quote, i = False, "", 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            decoded = cunescape_one(text, i + 1)
            if decoded is None:
                if not relax:
                    raise UnitError(f"{where}: unknown escape \\{text[i + 1]} in {text!r}", words)
                if warnings is not None:
                    warnings.append(f"{where}: unknown escape \\{text[i + 1]} kept verbatim, as systemd does")
                current += text[i : i + 2].encode()
                i += 2
            else:
                current += decoded[0]
                i += 1 + decoded[1]
            in_word = True
            continue
        if quote:
            if char == quote:
                quote = ""
            else:
                current += char.encode()
        elif char in "'\"":
            quote, in_word = char, True
        elif char.isspace():
            if in_word:
                words.append(current.decode(errors="surrogateescape"))
            current, in_word = bytearray(), False
        else:
            current += char.encode()
            in_word = True
        i += 1
    if quote:
        raise UnitError(f"{where}: unbalanced {quote} quote in {text!r}", words)
    if in_word:
        words.append(current.decode(errors="surrogateescape"))
    return words


def split_words(text: str, where: str, warnings: list[str] | None = None) -> list[str]:
    """ExecStart= words: quotes removed, C escapes decoded, unknown escapes kept (systemd's relaxed
    retry). Specifiers and `$VAR` are left for the caller."""
    return extract_words(text, where, relax=True, warnings=warnings)


def unit_name_unescape(text: str) -> str | None:
    """systemd's unit_name_unescape: `-` is `/`, `\\xNN` a byte; None for another backslash."""
    out, i = bytearray(), 0
    while i < len(text):
        if text[i] == "-":
            out += b"/"
        elif text[i] == "\\":
            digits = text[i + 2 : i + 4]
            if text[i + 1 : i + 2] != "x" or len(digits) != 2 or not _HEX.fullmatch(digits):
                return None
            out.append(int(digits, 16))
            i += 3
        else:
            out += text[i].encode()
        i += 1
    return out.decode(errors="surrogateescape")


def name_specifiers(unit_name: str) -> dict[str, str | None]:
    """The specifiers a unit's name decides (`%n %N %p %P %i %I %j %J %f %%`); None where the part
    cannot be unescaped."""
    base = unit_name.rpartition(".")[0] or unit_name
    prefix, _, instance = base.partition("@")
    last = prefix.rpartition("-")[2]
    path_source = instance or prefix
    unescaped_path = unit_name_unescape(path_source)
    return {
        "%": "%",
        "n": unit_name,
        "N": base,
        "p": prefix,
        "P": unit_name_unescape(prefix),
        "i": instance,
        "I": unit_name_unescape(instance),
        "j": last,
        "J": unit_name_unescape(last),
        "f": None if unescaped_path is None else "/" + unescaped_path.lstrip("/"),
    }


def expand_specifiers(value: str, unit_name: str, unresolved: list[Unresolved], what: str) -> str:
    """Resolve `%%` and the unit-name specifiers; others are recorded as unresolved and left as is."""
    known = name_specifiers(unit_name)

    def replace(match: re.Match[str]) -> str:
        letter = match.group(1)
        if known.get(letter) is not None:
            return known[letter]  # type: ignore[return-value]
        why = (
            f"%{letter}: the unit name {unit_name!r} cannot be unescaped"
            if letter in known
            else f"systemd specifier %{letter} is not resolved by the snapshot"
        )
        unresolved.append(Unresolved(what, why))
        return match.group(0)

    return re.sub(r"%(.)", replace, value, flags=re.DOTALL)
