"""The command that serves the draft in the serve check's own unit (check_unit.py): production's
ExecStart as systemd resolved it, plus `--speculative-config` (and `--enforce-eager` when configured),
refused before anything changes when it cannot work (`draft_argv`). Also the serve check's error and
run id, and the name of the drop-in versions before the check unit wrote on the production unit (a
leftover one is refused: host_record.py).
"""

from __future__ import annotations

import json
import posixpath
import time
import uuid

from eagle3_pipeline.server import container
from eagle3_pipeline.server.unit import ExecCommand, merge_unit, split_cat_output
from eagle3_pipeline.server.vllm_args import SHELLS, eagle3_draft, find_vllm, serving_argv
from eagle3_pipeline.server.vllm_find import appended_words_reach_vllm

# the vLLM names this module relies on (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("flag", "vllm serve", "--speculative-config"),
    ("flag", "vllm serve", "--enforce-eager"),
)
# Where versions before the check unit wrote a drop-in on the production unit: a leftover one is
# reported (never removed here: that would need a daemon-reload, which loads an operator's pending edits).
LEGACY_DROPIN_NAME = "zz-eagle3-serve-check.conf"
LEGACY_DIRS = ("/run/systemd/system", "/etc/systemd/system")
PRIVILEGE_PREFIXES = ("+", "!")  # `+`, `!`, `!!`: privileges a transient unit's argv cannot carry


class ServeCheckError(RuntimeError):
    """The serve check cannot go on (a command that cannot work, a host that refuses, nothing measured);
    the message says what to fix."""


def draft_argv(
    command: ExecCommand, checkpoint_dir: str, num_speculative_tokens: int, enforce_eager: bool
) -> list[str]:
    """The words that run `command` with the draft, as systemd made them (specifiers resolved per word:
    `%I` holding a space stays one word; `$VAR` left for systemd to expand). With `@`, argv[0] is
    dropped: a transient unit runs the program under its own path (vLLM does not read argv[0]).

    Raises:
        ServeCheckError: before anything is changed on the host, for a command that cannot work: not a
            vLLM server, vLLM inside a shell -c string (added flags would land outside it), a
            specifier the snapshot cannot resolve, `+`/`!` privilege prefixes, or a container that
            does not mount the draft.
    """
    if command.unresolved_specifiers:
        why = "; ".join(command.unresolved_specifiers)
        raise ServeCheckError(
            f"ExecStart uses systemd specifiers the check unit cannot carry over ({why}): write the value "
            "out in the unit, or serve the draft through a unit of your own; nothing was changed"
        )
    if any(p in command.prefixes for p in PRIVILEGE_PREFIXES):
        raise ServeCheckError(
            f"ExecStart has the privilege prefix {command.prefixes!r}, which a transient unit's command "
            "cannot carry: serve the draft through a unit of your own and set validate.serve_check: "
            "false; nothing was changed"
        )
    words = command.program_words()
    checkpoint_dir = _draft_path_in_container(words, checkpoint_dir)
    found = find_vllm(words)
    if (found is None or _in_shell(found[0])) and appended_words_reach_vllm(words, _no_file):
        # `bash -c '... exec vllm serve "$@"' NAME ARGS`: words added at the end reach vLLM's own line
        spec = json.dumps(eagle3_draft(checkpoint_dir, num_speculative_tokens), separators=(",", ":"))
        return [*words, "--speculative-config", spec, *(["--enforce-eager"] if enforce_eager else [])]
    if found is None:
        raise ServeCheckError(
            f"ExecStart runs {words[:1]}, not vLLM: add the draft to the server yourself (a second unit) "
            "and set validate.serve_check: false"
        )
    if _in_shell(found[0]):
        raise ServeCheckError(
            "ExecStart wraps vLLM in a shell -c string that names its own flags (added words would land "
            'outside vLLM; one ending in "$@" is followed): serve the draft through a second unit'
        )
    return serving_argv(
        words, eagle3_draft(checkpoint_dir, num_speculative_tokens), enforce_eager=enforce_eager
    )


def _in_shell(launcher: list[str]) -> bool:
    return any(posixpath.basename(w) in SHELLS for w in launcher)


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
    """A serve check's id (in its unit's name and host record): when, and a random part."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def vllm_exec(cat_text: str, unit: str) -> ExecCommand:
    """The unit's ExecStart line that runs vLLM (the last one naming vllm), after drop-ins."""
    parsed = merge_unit(split_cat_output(cat_text, default_path=unit), unit)
    candidates = [c for c in parsed.exec_start if "vllm" in c.raw] or parsed.exec_start[-1:]
    if not candidates:
        raise ServeCheckError(f"{unit} has no ExecStart= after its drop-ins: nothing to add the draft to")
    return candidates[-1]
