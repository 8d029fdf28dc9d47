"""bash's lexing of a script, as bash(1) describes it: words (each a list of parts: literal text, quoted
or not, and the expansions in it, not yet expanded) and operators. Quotes, backslashes, `$'...'`
(ANSI-C), `$"..."`, comments, `${...}`, `$(...)` and backticks are recognised; redirections
(`>file`, `2>&1`, `&>file`, `<in`) are dropped with their targets. `shell_script` expands and follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = ("&&", "||", ";;", "|&", ";", "&", "|", "\n", "(", ")")
_ANSI = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
         "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip


@dataclass
class Part:
    """A piece of a word: literal text, or an expansion (`kind` "param" or "unknown")."""

    kind: str  # "lit", "param", "unknown", "tilde"
    text: str  # the literal, the parameter name, or the unknown construct as written
    quoted: bool
    op: str = ""  # `${NAME<op><arg>}`
    arg: str = ""


Word = list[Part]


class _Lexer:
    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0
        self.tokens: list[Word | str] = []  # a word, or an operator string
        self.word: Word | None = None
        self.drop_next = False  # the next word is a redirection's target
        self.added = 0  # parts added so far (an empty `""` makes a word; a `"$@"` need not)

    def lit(self, text: str, quoted: bool) -> None:
        self.add(Part("lit", text, quoted))

    def add(self, part: Part) -> None:
        self.added += 1
        if self.word is None:
            self.word = []
        last = self.word[-1] if self.word else None
        if part.kind == "lit" and last is not None and last.kind == "lit" and last.quoted == part.quoted:
            last.text += part.text
            return
        self.word.append(part)

    def end_word(self) -> None:
        if self.word is not None:
            if self.drop_next:
                self.drop_next = False
            else:
                self.tokens.append(self.word)
        self.word = None

    def run(self) -> list[Word | str]:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t":
                self.end_word()
                self.i += 1
            elif c == "#" and self.word is None:
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            elif c == "\\":
                if s[self.i + 1 : self.i + 2] != "\n":  # backslash-newline: a continuation, removed
                    self.lit(s[self.i + 1 : self.i + 2], True)
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                end = len(s) if end < 0 else end
                self.lit(s[self.i + 1 : end], True)
                self.i = end + 1
            elif c == '"':
                self.i += 1
                self.double_quoted()
            elif c == "$":
                self.dollar(quoted=False)
            elif c == "`":
                self.backtick(quoted=False)
            elif c in "<>" or (c == "&" and s[self.i + 1 : self.i + 2] == ">"):
                self.redirection()
            elif c in ";&|\n()":
                self.end_word()
                op = next(o for o in _OPERATORS if s.startswith(o, self.i))
                self.tokens.append(op)
                self.i += len(op)
            elif c == "~" and self.word is None:
                self.add(Part("tilde", "~", False))
                self.i += 1
            else:
                self.lit(c, False)
                self.i += 1
        self.end_word()
        return self.tokens

    def double_quoted(self) -> None:
        s = self.s
        added = self.added
        while self.i < len(s) and s[self.i] != '"':
            c = s[self.i]
            if c == "\\" and s[self.i + 1 : self.i + 2] in ('"', "\\", "$", "`", "\n"):
                if s[self.i + 1] != "\n":
                    self.lit(s[self.i + 1], True)
                self.i += 2
            elif c == "$":
                self.dollar(quoted=True)
            elif c == "`":
                self.backtick(quoted=True)
            else:
                self.lit(c, True)
                self.i += 1
        if self.added == added:
            self.lit("", True)  # `""` is a word of its own, even empty (but `"$@"` may be none)
        self.i += 1

    def dollar(self, quoted: bool) -> None:
        s, i = self.s, self.i
        nxt = s[i + 1 : i + 2]
        if nxt == "'" and not quoted:
            self.ansi_c()
        elif nxt == '"' and not quoted:
            self.i += 2
            self.double_quoted()
        elif nxt == "{":
            end = _matching(s, i + 1, "{", "}")
            self.braced(s[i + 2 : end], quoted, s[i : end + 1])
            self.i = end + 1
        elif nxt == "(":
            end = _matching(s, i + 1, "(", ")")
            self.add(Part("unknown", s[i : end + 1], quoted))
            self.i = end + 1
        elif nxt and (nxt in "@*#?$!-" or nxt.isdigit()):
            self.add(Part("param", nxt, quoted))
            self.i += 2
        elif match := _NAME.match(s, i + 1):
            self.add(Part("param", match.group(0), quoted))
            self.i = match.end()
        else:
            self.lit("$", quoted)
            self.i += 1

    def braced(self, inner: str, quoted: bool, written: str) -> None:
        match = re.match(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])(:?[-=+?]|)(.*)$", inner, re.DOTALL)
        if match is None or (match.group(3) and not match.group(2)):
            self.add(Part("unknown", written, quoted))  # ${#X}, ${X%y}, ${X/a/b}: not followed here
            return
        self.add(Part("param", match.group(1), quoted, match.group(2), match.group(3)))

    def ansi_c(self) -> None:
        s, i, out = self.s, self.i + 2, []
        while i < len(s) and s[i] != "'":
            if s[i] == "\\" and i + 1 < len(s):
                letter = s[i + 1]
                if letter in _ANSI:
                    out.append(_ANSI[letter])
                    i += 2
                    continue
                hexa = re.match(r"x([0-9A-Fa-f]{1,2})|([0-7]{1,3})", s[i + 1 :])
                if hexa:
                    out.append(chr(int(hexa.group(1), 16) if hexa.group(1) else int(hexa.group(2), 8)))
                    i += 1 + len(hexa.group(0))
                    continue
            out.append(s[i])
            i += 1
        self.lit("".join(out), True)
        self.i = i + 1

    def backtick(self, quoted: bool) -> None:
        end = self.s.find("`", self.i + 1)
        end = len(self.s) if end < 0 else end
        self.add(Part("unknown", self.s[self.i : end + 1], quoted))
        self.i = end + 1

    def redirection(self) -> None:
        """`>`, `2>&1`, `&>file`, `<in`: dropped with their target (a number before is the fd)."""
        if self.word and len(self.word) == 1 and self.word[0].kind == "lit" and self.word[0].text.isdigit():
            self.word = None if not self.word[0].quoted else self.word
        self.end_word()
        match = re.compile(r"&>>?|[0-9]*(?:<<<|<<-?|<>|>>|>\||<&|>&|<|>)").match(self.s, self.i)
        assert match is not None
        self.i = match.end()
        if match.group(0).endswith("&"):
            dup = re.compile(r"[0-9]+-?|-").match(self.s, self.i)
            if dup:
                self.i = dup.end()
                return
        self.drop_next = True


def _matching(s: str, start: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at s[start] (nesting counted, quotes not)."""
    depth = 0
    for j in range(start, len(s)):
        depth += (s[j] == open_) - (s[j] == close)
        if depth == 0:
            return j
    return len(s)


def lex(script: str) -> list[Word | str]:
    """A script's tokens: words (lists of parts) and operator strings."""
    return _Lexer(script).run()


def lex_word(text: str) -> Word:
    """One word's parts (the text of `${X:-text}`)."""
    tokens = [t for t in lex(text) if not isinstance(t, str)]
    return [part for word in tokens for part in word]
