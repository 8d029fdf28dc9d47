"""server.json, the served vLLM unit's snapshot, read back: `ServerSnapshot.load` is the one place it is
parsed, and every job that reads it (generation, its preflight, the lifecycle and tunnel, extraction's
engine settings, provenance, the report, the replica check) takes the typed object.

server/snapshot.py writes the file (build_server_json); its format is that function's, unchanged here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ServerSnapshot:
    """server.json's fields (None where the file has no such key; build_server_json writes them all but
    vllm_version and python), and `raw`, the file as written, for a reader that needs every key."""

    model: str | None = None
    served_model_name: str | list[str] | None = None  # a name vLLM was given (one; a list in hand-made files)
    host: str | None = None  # the address vLLM listens on as the host sees it (None: every interface)
    port: int | None = None
    base_url: str | None = None
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    trust_remote_code: bool | None = None
    chat_template: str | None = None
    args: Mapping[str, Any] = field(default_factory=dict)  # the vLLM flags, secrets redacted
    env: Mapping[str, Any] = field(default_factory=dict)  # the unit's environment, secrets redacted
    unit: str | None = None
    source_host: str | None = None
    vllm_version: str | None = None
    python: str | None = None  # the unit's interpreter, where the snapshot could read it
    identity: str | None = None  # hash of what changes the server's replies (identity.json)
    unresolved: tuple[Mapping[str, str], ...] = ()  # {what, why} the snapshot could not know
    warnings: tuple[str, ...] = ()
    redaction: Mapping[str, Any] | None = None  # the unit's secrets' fingerprints (secrets.learn)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def load(cls, path: str | Path) -> ServerSnapshot:
        """Raises OSError (no file) or ValueError (not JSON)."""
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerSnapshot:
        """From server.json's parsed content (a key it lacks stays at its default)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"server.json holds {type(data).__name__}, not an object")
        known = {f.name for f in dataclasses.fields(cls)} - {"raw"}
        values = {key: data[key] for key in known if key in data}
        values |= {"args": dict(data.get("args") or {}), "env": dict(data.get("env") or {})}
        values |= {
            "unresolved": tuple(data.get("unresolved") or ()),
            "warnings": tuple(data.get("warnings") or ()),
        }
        return cls(**values, raw=dict(data))

    @classmethod
    def of(cls, snapshot: ServerSnapshot | Mapping[str, Any]) -> ServerSnapshot:
        """A snapshot as it is, or one parsed from a dict: the lifecycle, tunnel, secrets and serve-check
        functions take either, as tests pass server.json's dict; every job passes the typed snapshot."""
        return snapshot if isinstance(snapshot, ServerSnapshot) else cls.from_json(snapshot)

    @property
    def request_model(self) -> str | None:
        """The model name requests carry: served_model_name (its first), else the model."""
        model = self.served_model_name or self.model
        return model[0] if isinstance(model, list) else model

    def stated(self, keys: Iterable[str]) -> dict[str, Any]:
        """The file's values of `keys` that it has, in that order."""
        return {key: self.raw[key] for key in keys if key in self.raw}
