"""The serve check's drop-in on a systemd unit: its file and the ExecStart line that runs the draft.

On the GPU box the target occupies every GPU, so the draft cannot be served beside it: the serve check
installs a RUNTIME drop-in `/run/systemd/system/UNIT.d/zz-eagle3-serve-check.conf` (gone on reboot)
that resets ExecStart and sets it to the unit's own command plus `--speculative-config` (and
`--enforce-eager` when configured). Drop-ins of all unit folders are applied in file-name order, so
`zz-` wins over the unit's own. Its first line is a marker (run id, the unit's state before), so a
leftover one is recognised as ours; host_record.py installs, restores and recovers it.
"""

from __future__ import annotations

import posixpath
import re
import time
import uuid
from typing import Any

from eagle3_pipeline.server import container
from eagle3_pipeline.server.unit import ExecCommand, merge_unit, split_cat_output, split_words
from eagle3_pipeline.server.vllm_args import SHELLS, eagle3_draft, find_vllm, serving_argv

DROPIN_NAME = "zz-eagle3-serve-check.conf"
UNIT_DIR = "/run/systemd/system"  # runtime: a drop-in here does not survive a reboot
LEGACY_UNIT_DIR = "/etc/systemd/system"  # where versions before the runtime drop-in wrote it
RECOVERY_DIRS = (UNIT_DIR, LEGACY_UNIT_DIR)  # searched for a leftover drop-in of ours
MARKER = "# eagle3-pipeline serve_check"
_MARKER_LINE = re.compile(rf"^{re.escape(MARKER)} run=(?P<run>\S+) was_active=(?P<was_active>yes|no)\b")
_LEGACY_MARKER = "# Written by eagle3-pipeline's serve_check"


class ServeCheckError(RuntimeError):
    """The serve check cannot go on (a drop-in that cannot work, a host that refuses, nothing measured);
    the message says what to fix."""


def systemd_quote(word: str) -> str:
    """One ExecStart word, double-quoted for systemd (`%` doubled; `$VAR` left to systemd)."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def exec_start_with_draft(
    command: ExecCommand, checkpoint_dir: str, num_speculative_tokens: int, enforce_eager: bool
) -> str:
    """The ExecStart value that runs `command` with the draft; its prefixes and `$VAR`s are kept, and
    its words are those systemd made (specifiers resolved per word: `%I` holding a space stays one word).

    Raises:
        ServeCheckError: before anything is changed on the host, for a drop-in that cannot work: the
            command is not a vLLM server, wraps it in a shell (`bash -c "..."`, where added flags would
            land outside the vLLM command), uses a specifier the snapshot cannot resolve (`%h`: the
            drop-in would carry it as a literal), or runs a container that does not mount the draft.
    """
    if command.unresolved_specifiers:
        why = "; ".join(command.unresolved_specifiers)
        raise ServeCheckError(
            f"ExecStart uses systemd specifiers the drop-in cannot carry over ({why}): write the value "
            "out in the unit, or serve the draft through a second unit; nothing was changed"
        )
    words = command.words if command.words is not None else split_words(command.raw, "ExecStart=")
    checkpoint_dir = _draft_path_in_container(words, checkpoint_dir)
    found = find_vllm(words)
    if found is None:
        raise ServeCheckError(
            f"ExecStart runs {words[:1]}, not vLLM: add the draft to the server yourself (a second unit) "
            "and set validate.serve_check: false"
        )
    if any(posixpath.basename(w) in SHELLS for w in found[0]):
        raise ServeCheckError(
            "ExecStart wraps vLLM in a shell -c string: serve the draft through a second unit"
        )
    served = serving_argv(
        words, eagle3_draft(checkpoint_dir, num_speculative_tokens), enforce_eager=enforce_eager
    )
    return command.prefixes + " ".join(systemd_quote(w) for w in served)


def _draft_path_in_container(words: list[str], checkpoint_dir: str) -> str:
    """The draft's path as the server sees it: through a container's bind mounts when the command runs
    one (`docker run -v HOST:CONTAINER ...`); refused when no mount holds it."""
    if container.engine_at(words) is None:
        return checkpoint_dir
    run = container.parse_run(words, {}, _no_file)
    if run is None:
        return checkpoint_dir
    inside = run.container_path(checkpoint_dir)
    if inside is None:
        raise ServeCheckError(
            f"the unit's container ({run.image}) does not mount {checkpoint_dir}, where the draft is: set "
            "validate.remote_dir to a folder under one of its -v/--mount sources "
            f"({', '.join(s for s, _ in run.mounts) or 'none'}); nothing was changed"
        )
    return inside


def _no_file(path: str) -> str:
    raise OSError(f"{path} is not read here")


def new_run_id() -> str:
    """The id written in the drop-in's marker: when, and a random part."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def dropin_text(exec_start: str, run_id: str = "", was_active: bool = True) -> str:
    """The drop-in: the marker line (run id, the unit's state before), then ExecStart reset and set."""
    return (
        f"{MARKER} run={run_id or new_run_id()} was_active={'yes' if was_active else 'no'}\n"
        "# Temporary (a runtime drop-in, gone on reboot); the next eagle3-pipeline run removes it if\n"
        "# this one died. Safe to delete: then `systemctl daemon-reload` and restart the unit.\n"
        f"[Service]\nExecStart=\nExecStart={exec_start}\n"
    )


def parse_marker(text: str) -> dict[str, Any] | None:
    """{'run', 'was_active'} from a drop-in of ours (was_active None for the legacy marker); None
    when the text is not ours."""
    match = _MARKER_LINE.match(text)
    if match:
        return {"run": match["run"], "was_active": match["was_active"] == "yes"}
    if text.startswith(_LEGACY_MARKER):
        return {"run": "legacy", "was_active": None}
    return None


def dropin_path(unit: str, unit_dir: str = UNIT_DIR) -> str:
    """Where our drop-in for unit goes.

    Raises:
        ServeCheckError: a unit name that would put it elsewhere (a `/`, or not a .service).
    """
    if "/" in unit or not unit.endswith(".service") or unit.startswith("."):
        raise ServeCheckError(f"server.unit {unit!r} is not a NAME.service unit name")
    return f"{unit_dir}/{unit}.d/{DROPIN_NAME}"


def vllm_exec(cat_text: str, unit: str) -> ExecCommand:
    """The unit's ExecStart line that runs vLLM (the last one naming vllm), after drop-ins."""
    parsed = merge_unit(split_cat_output(cat_text, default_path=unit), unit)
    candidates = [c for c in parsed.exec_start if "vllm" in c.raw] or parsed.exec_start[-1:]
    if not candidates:
        raise ServeCheckError(f"{unit} has no ExecStart= after its drop-ins: nothing to add the draft to")
    return candidates[-1]
