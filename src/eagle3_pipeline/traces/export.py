"""conversations.jsonl: the kept traces in the conversation format SpecForge and speculators read.

One line per trace:
    {"id": ..., "conversations": [{"role": "system", "content": ...}   (only when there is one),
                                  {"role": "user", "content": question},
                                  {"role": "assistant", "content": answer, "reasoning_content": thinking}]}
Written by polars in one streaming pass (no Python per row). Missing answers or thinking (a reply cut
off by max_tokens) are written as "" so that every assistant message has both keys.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

_NULL = pl.lit(None, dtype=pl.String)
# polars writes every struct field; the key is removed from user and system messages afterwards.
# Inside JSON strings quotes are escaped, so this exact text can only be a key with a null value.
_NULL_REASONING = ',"reasoning_content":null'


def _message(role: str, content: pl.Expr, reasoning: pl.Expr = _NULL) -> pl.Expr:
    return pl.struct(role=pl.lit(role), content=content, reasoning_content=reasoning)


def conversation_line() -> pl.Expr:
    """Expression: the JSON line of a trace (columns id, system, question, reasoning, content)."""
    has_system = pl.col("system").fill_null("") != ""
    messages = pl.concat_list(
        pl.when(has_system).then(_message("system", pl.col("system"))),
        _message("user", pl.col("question")),
        _message("assistant", pl.col("content").fill_null(""), pl.col("reasoning").fill_null("")),
    ).list.drop_nulls()
    return (
        pl.struct(pl.col("id"), messages.alias("conversations"))
        .struct.json_encode()
        .str.replace_all(_NULL_REASONING, "", literal=True)
        .alias("line")
    )


def write_conversations(traces: pl.LazyFrame, path: str | Path) -> None:
    """Stream `traces` to `path` as JSON lines (a one-column CSV without header or quoting)."""
    traces.select(conversation_line()).sink_csv(
        path, include_header=False, quote_style="never", check_extension=False
    )
