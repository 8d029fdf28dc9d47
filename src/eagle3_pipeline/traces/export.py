"""conversations.jsonl: the kept traces in the conversation format SpecForge and speculators read.

One line per trace:
    {"id": ..., "conversations": [{"role": "system", "content": ...}   (only when there is one),
                                  {"role": "user", "content": question},
                                  {"role": "assistant", "content": answer, "reasoning_content": thinking}]}
Missing answers or thinking (a reply cut off by max_tokens) are written as "" so that every
assistant message has both keys. The lines are assembled by polars string expressions in one
streaming pass: nine times faster here than encoding nested structs, and no Python per row.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

# JSON string escapes (RFC 8259 section 7): quote, backslash and the control characters U+0000-U+001F
_ESCAPES = {"\\": "\\\\", '"': '\\"'} | {chr(i): f"\\u{i:04x}" for i in range(32)}
_ESCAPES |= {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def json_string(text: pl.Expr) -> pl.Expr:
    """Expression: `text` as a JSON string literal, quotes included (null is not expected)."""
    escaped = text.str.replace_many(list(_ESCAPES), list(_ESCAPES.values()))
    return pl.concat_str(pl.lit('"'), escaped, pl.lit('"'))


def conversation_line() -> pl.Expr:
    """Expression: the JSON line of a trace (columns id, system, question, reasoning, content)."""
    system = pl.col("system").fill_null("")
    system_message = (
        pl.when(system != "")
        .then(pl.concat_str(pl.lit('{"role":"system","content":'), json_string(system), pl.lit("},")))
        .otherwise(pl.lit(""))
    )
    return pl.concat_str(
        pl.lit('{"id":'),
        json_string(pl.col("id")),
        pl.lit(',"conversations":['),
        system_message,
        pl.lit('{"role":"user","content":'),
        json_string(pl.col("question").fill_null("")),
        pl.lit('},{"role":"assistant","content":'),
        json_string(pl.col("content").fill_null("")),
        pl.lit(',"reasoning_content":'),
        json_string(pl.col("reasoning").fill_null("")),
        pl.lit("}]}"),
    ).alias("line")


def write_conversations(traces: pl.LazyFrame, path: str | Path) -> None:
    """Stream `traces` to `path` as JSON lines (a one-column CSV without header or quoting)."""
    traces.select(conversation_line()).sink_csv(
        path, include_header=False, quote_style="never", check_extension=False
    )
