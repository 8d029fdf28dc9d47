"""Logging for the scripts Snakemake runs: one log per job, secrets scrubbed, errors stated plainly."""

from __future__ import annotations

import logging
import sys
from types import TracebackType

from eagle3_pipeline.server.secrets import REDACTOR, protect_logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_script_logging(log_path: str, name: str) -> logging.Logger:
    """Route logging, warnings and stderr (tqdm bars, library noise) to the job's log through the
    redacting filter. An uncaught error is logged with its traceback and ends the script with a
    one-line, scrubbed message on the console, where Snakemake's user sees it."""
    console = sys.stderr
    logging.basicConfig(filename=log_path, level=logging.INFO, format=FORMAT, force=True)
    logging.captureWarnings(True)
    protect_logging()
    sys.stderr = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the job
    logger = logging.getLogger(name)

    def excepthook(kind: type[BaseException], err: BaseException, tb: TracebackType | None) -> None:
        logger.error("%s failed", name, exc_info=(kind, err, tb))
        console.write(f"{name} failed: {kind.__name__}: {REDACTOR.scrub(str(err))} (log: {log_path})\n")

    sys.excepthook = excepthook
    return logger
