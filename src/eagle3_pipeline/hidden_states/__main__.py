"""`python -m eagle3_pipeline.hidden_states JOB.json`: extract one shard of every split as the job file
says (hidden_states/job.py).

Run in every process that `accelerate launch` starts for rule extract_hidden_states
(eagle3_pipeline.launch.exec_job); its stdout and stderr are the rule's log. The `__main__` guard
matters: spawned worker processes import this module again.
"""

import sys

from eagle3_pipeline.hidden_states.extract import extract_shards
from eagle3_pipeline.hidden_states.job import read_jobs
from eagle3_pipeline.logs import setup_logging

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(
            "usage: python -m eagle3_pipeline.hidden_states JOB.json (see scripts/extract_hidden_states.py)"
        )
    setup_logging(None, "extract_hidden_states")
    extract_shards(*read_jobs(sys.argv[1]))
