"""What to fix when a job fails on the user's input: one line naming the config key or file.

A job's uncaught error ends its log and its stderr with `ERROR: <rule> failed: <Kind>: <message> (fix:
<what>; log: <path>)` (logs.setup_logging); the Snakefile's `onerror` prints each failed job's line
again after Snakemake's own error report (`print_failures`), so that the fix is the run's last words.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PREFIX = "ERROR: "
SSH = (
    "server.host (an ~/.ssh/config alias or user@host[:port] that resolves and answers from here), "
    "server.ssh.* (known_hosts, connect_timeout_s) or ~/.ssh/known_hosts (ssh-keyscan -p PORT HOST)"
)
# By exception class name along the error's MRO, so that this module imports none of the stages'. Only
# errors that come from the user's input or setup: a bug elsewhere gets no hint rather than a wrong one.
FIXES = {
    "ConfigError": "the config key the message names (config/schema.yaml describes each)",
    "DatasetError": "dataset.path (the file, its format: .jsonl, .json, .parquet, a folder or hf://)",
    "RowError": "dataset.path (its rows: open-perfectblend's conversations or role/content messages)",
    "HostError": SSH,
    "TransportError": SSH,
    "UnitError": "server.unit or server.unit_file (the systemd unit that runs `vllm serve`)",
    "ReplicaError": "server.replicas (the replica and field the message names)",
    "ServerUnavailable": "server.host / server.base_url (the server must answer) or server.start_timeout_s",
    "DiskBudgetError": "hidden_states.max_disk_gb, or free space under results/",
    "PortError": "demo.port (another process holds it)",
}


def fix_for(error: BaseException) -> str | None:
    """The config key or file to fix for `error`, or None when it is not the user's input."""
    for kind in type(error).__mro__:
        if kind.__name__ in FIXES:
            return FIXES[kind.__name__]
    return None


def error_line(name: str, error: BaseException, message: str, log_path: str | None) -> str:
    """The one line a failed job ends with (`message`: the error's text, already redacted)."""
    notes = [f"fix: {fix}"] if (fix := fix_for(error)) else []
    notes += [f"log: {log_path}"] if log_path else []
    tail = f" ({'; '.join(notes)})" if notes else ""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return f"{PREFIX}{name} failed: {type(error).__name__}: {first}{tail}"


def failed_job_logs(snakemake_log: str) -> list[Path]:
    """The logs of the jobs Snakemake's own log reports as failed ('Error in rule ...' blocks)."""
    logs: list[Path] = []
    blocks = re.split(r"^(?=Error in rule )", snakemake_log, flags=re.M)
    for block in (block for block in blocks if block.startswith("Error in rule ")):
        match = re.search(r"^\s*log: (\S+)", block, flags=re.M)
        if match and Path(match.group(1)).exists() and Path(match.group(1)) not in logs:
            logs.append(Path(match.group(1)))
    return logs


def last_error(log: Path) -> str | None:
    """The last `ERROR: ...` line of a job's log."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(PREFIX)]
    return lines[-1] if lines else None


def print_failures(snakemake_logs: str | Path | list[str] | None) -> None:
    """Snakefile `onerror`: each failed job's last ERROR line, after Snakemake's report (stderr).

    Args:
        snakemake_logs: The `log` onerror is given: Snakemake's own log file (a list of them in 9.x).
    """
    paths = [snakemake_logs] if isinstance(snakemake_logs, (str, Path)) else list(snakemake_logs or [])
    text = "".join(Path(path).read_text(errors="replace") for path in paths if Path(path).is_file())
    found = [line for log in failed_job_logs(text) if (line := last_error(log))]
    if found:
        sys.stderr.write("\nWhat to fix:\n" + "".join(f"{line}\n" for line in found))
