"""The local server's log, written with its secrets scrubbed: `python -m eagle3_pipeline.server.log_filter
LOG REDACTION` copies its standard input (the server's stdout and stderr) to LOG line by line through
`secrets`' scrubbers, with the fingerprints in the REDACTION file (never the values). vLLM prints its
non-default arguments at start, the API key among them; the server runs detached from the job that
started it, so the filter is a process of its own beside it, ending when the server closes its output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eagle3_pipeline import secrets


def main(log_path: str, redaction_path: str) -> None:
    redactor = secrets.Redactor()
    for table in json.loads(Path(redaction_path).read_text()):
        redactor.learn(table)
    with open(log_path, "a", encoding="utf-8", errors="replace") as out:
        for line in sys.stdin.buffer:
            out.write(redactor.scrub(line.decode(errors="replace")))
            out.flush()  # the log tail shown on a failed start must be current


if __name__ == "__main__":
    main(*sys.argv[1:3])
