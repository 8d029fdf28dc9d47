"""The one logging setup of every entry point: secrets scrubbed, errors stated plainly.

- `stage(snakemake)`: the first line of every script under scripts/. Routes logging, warnings and
  stderr to the job's log (`snakemake.log[0]`) through the redacting filter, reports an uncaught error
  with its traceback in the log and one scrubbed line on the console, and writes the job's provenance
  beside the log (`<log>.provenance.json`, see provenance.py).
- stdout and stderr are scrubbed too (`RedactingStream`): a library that prints a server's reply or
  its own arguments writes no secret to the log or the console.
- `setup_logging(None, name)`: the same for a `python -m eagle3_pipeline...` entry point (the launcher,
  the accelerate jobs, the vLLM worker), whose stderr the caller already sends to the job's log.
"""

from __future__ import annotations

import io
import logging
import sys
from types import TracebackType
from typing import Any, TextIO

from eagle3_pipeline import provenance
from eagle3_pipeline.fixes import error_line
from eagle3_pipeline.secrets import REDACTOR, protect_logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RedactingStream(io.TextIOBase):
    """A text stream that scrubs what is written to it (`REDACTOR.scrub`) before passing it on.

    Whole lines are scrubbed, so a secret written in pieces (`print(a, b)` writes three times) is
    still seen whole; a partial line is scrubbed and passed on at `flush` (tqdm's bars flush).
    """

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self.target = target
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        lines, newline, self._pending = self._pending.rpartition("\n")
        if newline:
            self.target.write(REDACTOR.scrub(lines + newline))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.target.write(REDACTOR.scrub(self._pending))
            self._pending = ""
        self.target.flush()

    def fileno(self) -> int:  # for code that hands the stream to a child process (unscrubbed there)
        return self.target.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override] - read by tqdm and click
        return getattr(self.target, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return False


def setup_logging(log_path: str | None, name: str) -> logging.Logger:
    """Route logging and warnings through the redacting filter, to `log_path` (else stderr).

    With a `log_path`, stderr (tqdm bars, library noise) goes there too. An uncaught error is logged
    with its traceback and ends the log and the console with one scrubbed line, `ERROR: ...`, naming
    the config key or file to fix where the error comes from the user's input (fixes.error_line).

    Args:
        log_path: The job's log file, or None to log to stderr (already the job's log).
        name: The entry point's name, for the logger and the error line.

    Returns:
        The entry point's logger.
    """
    console = _unwrapped(sys.stderr)
    if log_path is None:
        logging.basicConfig(stream=console, level=logging.INFO, format=FORMAT, force=True)
        sys.stderr = RedactingStream(console)
    else:
        logging.basicConfig(filename=log_path, level=logging.INFO, format=FORMAT, force=True)
        sys.stderr = RedactingStream(open(log_path, "a", buffering=1))  # noqa: SIM115 - the job's life
    sys.stdout = RedactingStream(_unwrapped(sys.stdout))
    logging.captureWarnings(True)
    protect_logging()
    logger = logging.getLogger(name)

    def excepthook(kind: type[BaseException], err: BaseException, tb: TracebackType | None) -> None:
        logger.error("%s failed", name, exc_info=(kind, err, tb))
        # the last line of the log and of the console: what failed and which key or file to fix
        line = error_line(name, err, REDACTOR.scrub(str(err)), log_path)
        if log_path is not None:  # else the console is the log
            sys.stderr.write(line + "\n")
        console.write(line + "\n")

    sys.excepthook = excepthook
    return logger


def _unwrapped(stream: TextIO) -> TextIO:
    """The stream under any RedactingStream (setup_logging called twice wraps once)."""
    return stream.target if isinstance(stream, RedactingStream) else stream


def stage(snakemake: Any, name: str | None = None) -> logging.Logger:
    """Set up a `script:` job: its log (`setup_logging`) and its provenance record beside the log.

    Args:
        snakemake: The object Snakemake injects into a `script:` (rule, log, input, params, wildcards).
        name: The logger's name; the rule's name by default.

    Returns:
        The job's logger.
    """
    log_path = str(snakemake.log[0])
    logger = setup_logging(log_path, name or snakemake.rule)
    server_json = provenance.find_server_json([*snakemake.input, *snakemake.params])
    provenance.write(log_path, snakemake.rule, dict(snakemake.wildcards.items()), server_json)
    return logger
