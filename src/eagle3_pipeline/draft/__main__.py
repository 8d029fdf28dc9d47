"""`python -m eagle3_pipeline.draft JOB.json`: train the draft as the job file says (draft/job.py).

Run in every process that `accelerate launch` starts for rule train_draft or train_draft_window
(eagle3_pipeline.launch.exec_job); its stdout and stderr are the rule's log.
"""

import sys

from eagle3_pipeline.draft.job import read_job
from eagle3_pipeline.draft.train import main
from eagle3_pipeline.logs import setup_logging

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m eagle3_pipeline.draft JOB.json (written by scripts/train_draft.py)")
    setup_logging(None, "train_draft")
    main(read_job(sys.argv[1]))
