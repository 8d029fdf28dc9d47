"""Rule serve_extraction_engine's entry point:
`python -m eagle3_pipeline.hidden_states.engine_job JOB TARGET_CONFIG SERVER_JSON LOG`.

JOB is the rule's params.job, one JSON object (`job_text`): the whole hidden_states section, the
engine's folder and log, the service() output and the folder where the run keeps its engine stats
(results/RUN/hidden_states/engine_stats/[epoch-E-window-W/], one START_ID.json per engine start);
TARGET_CONFIG the target's config.json and SERVER_JSON the served unit's snapshot (the rule's input
and params).
The rule runs this with `shell:` and `exec`, not `script:`: Snakemake ends a service job by signalling
the process it started for a `shell:` command, and a `script:` one is never signalled (Snakemake
9.27.1, shell.py registers only a rule's own shell commands). The engine serves its extraction jobs
until that SIGTERM (engine.serve), then writes its report.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from eagle3_pipeline.hidden_states.engine import die_with_parent
from eagle3_pipeline.logs import setup_logging
from eagle3_pipeline.settings import HiddenStatesSettings, as_params, section


def job_text(
    hidden_states: HiddenStatesSettings,
    directory: str,
    log: str | None,
    service: str,
    stats: str | None = None,
) -> str:
    """The rule's params.job: the engine job's settings and paths, as one JSON text (a shell word)."""
    data = {"hidden_states": as_params(hidden_states), "dir": directory, "log": log, "service": service}
    return json.dumps(data | {"stats": stats}, sort_keys=True)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        usage = "usage: python -m eagle3_pipeline.hidden_states.engine_job JOB TARGET_CONFIG SERVER_JSON LOG"
        print(usage, file=sys.stderr)  # noqa: T201
        return 2
    job, target_config, server_json, log = json.loads(argv[0]), argv[1], argv[2], argv[3]
    # Snakemake ends a service job by a signal once its consumers are done, but a snakemake that exits
    # first (a SIGTERM to it as its last consumer finished) may never send it: the job's own parent
    # death does (serve() then stops the engine); a parent gone before the call means the same
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:
        return 1
    setup_logging(log, "serve_extraction_engine")
    from eagle3_pipeline.hidden_states.vllm_extraction import serve_engine  # torch: after the log is set

    serve_engine(
        section(HiddenStatesSettings, job["hidden_states"]),
        Path(target_config).parent,
        Path(server_json),
        Path(job["dir"]),
        engine_log=Path(job["log"]) if job["log"] else None,
        marker=Path(job["service"]),
        record_dir=Path(job["stats"]) if job.get("stats") else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
