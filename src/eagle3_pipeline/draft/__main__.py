"""`python -m eagle3_pipeline.draft JOB.json`: train the draft as the job file says (draft/job.py).

Run in every process that `accelerate launch` starts for rule train_draft or train_draft_window
(eagle3_pipeline.launch.exec_job); its stdout and stderr are the rule's log.
"""

import os
import sys
from collections.abc import MutableMapping

from eagle3_pipeline.draft.job import read_job
from eagle3_pipeline.draft.train import main
from eagle3_pipeline.logs import setup_logging


def configure_cuda_allocator(environ: MutableMapping[str, str]) -> None:
    """CUDA's caching allocator with expandable segments: batches of varying length (and the TTT steps'
    shapes) otherwise fragment it into reserved-but-unusable blocks. Read when CUDA first allocates, so
    set before training starts; a user's own PYTORCH_CUDA_ALLOC_CONF wins. No effect on CPU."""
    environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


if __name__ == "__main__":
    configure_cuda_allocator(os.environ)
    if len(sys.argv) != 2:
        sys.exit("usage: python -m eagle3_pipeline.draft JOB.json (written by scripts/train_draft.py)")
    setup_logging(None, "train_draft")
    main(read_job(sys.argv[1]))
