# hidden_states.max_disk_gb: the plan under the cap (planning.window_plan.WindowPlan), made when the
# workflow is parsed: one extraction pass whose states stay for every epoch when every shard fits the
# cap at once, else the training windows (which shards an epoch's plan window extracts, trains on and
# deletes) and the training state passed from one draft window to the next
# (eagle3_pipeline.planning.windows; the words: eagle3_pipeline/planning/__init__.py).
import sys

from eagle3_pipeline.config import ConfigError
from eagle3_pipeline.planning.disk_cap import parse_time_hidden_size, window_plan
from eagle3_pipeline.planning.windows import TrainingWindows, training_state
from eagle3_pipeline.settings import runtime_only, runtime_params

CAPPED = SETTINGS.hidden_states.max_disk_gb is not None
# Each shard sized from its traces' real tokens where its check_disk_budget record is up to date
# (planning.disk_cap.traced_states: a stat and a small JSON per shard), else at its config bound (every
# sample as long as max_seq_len); a cap below one shard's bound is refused here, with the numbers. The
# cap also holds the two training state files each draft's training keeps at once
# (planning/state_files.py). A run planned before the traces were checked stops before its first
# extraction when they plan otherwise (check_window_plan, rules/budget.smk): the next run plans from them.
WINDOW_PLAN = (
    window_plan(SETTINGS, parse_time_hidden_size(SETTINGS), SHARDS, RESULTS)
    if CAPPED
    else None
)
# Per epoch, its plan windows (none for one pass): the shards in an order seeded by train.seed and the
# epoch, cut into windows that fit the cap (planning.window_plan.sized_windows; plan_windows records
# them), so each epoch groups them anew; the count can differ between epochs when the shards differ in
# size.
EPOCH_WINDOWS = (WINDOW_PLAN.windows or []) if CAPPED else []
EPOCHS = SETTINGS.train.epochs
# shards in the largest window; None: no windows (uncapped, or one pass under the cap)
WINDOW = WINDOW_PLAN.largest_window if EPOCH_WINDOWS else None
# The windows each draft trains in: the main draft's, every plan window; a learning-curve point's,
# those holding some of its shards, reading only those, each shard as often per epoch as without a cap
# (it extracts nothing of its own); the cap counts its training state files (planning.state_files)
# and the next window's extraction waits for it too (get_extraction_gate). None: no windows.
TRAINING = (
    TrainingWindows.plan(RESULTS, EPOCH_WINDOWS, VARIANT_PLAN) if WINDOW else None
)

# The windows form one chain of every epoch's windows' training jobs (one per draft, linked by the
# extraction gates), and Snakemake builds its DAG recursively (about 3 Python frames per link,
# measured): room for the chains, as for a long DAG.
sys.setrecursionlimit(
    max(sys.getrecursionlimit(), 2000 + 10 * sum(map(len, EPOCH_WINDOWS)))
)
if CAPPED and SETTINGS.validate.baseline:
    raise ConfigError(
        "hidden_states.max_disk_gb with validate.baseline: the baseline's hidden states are not "
        "counted in the cap, nor its draft trained in windows; set validate.baseline: false (or "
        "hidden_states.max_disk_gb: null)"
    )
# Where extraction writes: one folder per epoch in windows (each epoch extracts anew)
EPOCH_DIR = "epoch-{epoch}/" if WINDOW else ""
STATES = f"{RESULTS}/hidden_states/{EPOCH_DIR}".rstrip("/")


def window_training_state(epoch, window, variant=""):
    """The training state of draft `variant` after its draft window `window` of epoch `epoch` (a temp
    file: kept until used)."""
    return training_state(RESULTS, epoch, window, variant)


# check_window_plan's record (rules/budget.smk): the plan confirmed against the checked traces
WINDOW_PLAN_CHECK = f"{RESULTS}/budget/window_plan.json"


def get_extraction_gate(wildcards):
    """Under a cap, no shard is extracted before check_window_plan confirmed the plan from the traces
    (ancient: a later change of it reruns no done shard), and in windows shard k of epoch e only once
    every draft that reads the previous plan window trained on it (and its states are deleted): the
    disk never holds two windows (TrainingWindows.extraction_gate).
    """
    if not CAPPED:
        return []
    gate = (
        TRAINING.extraction_gate(wildcards.epoch, wildcards.shard) if WINDOW else None
    )
    return [ancient(WINDOW_PLAN_CHECK)] if gate is None else gate


def draft_window_shards(wildcards):
    """The shard entries train_draft_window's draft reads in its window (a learning-curve point's may
    repeat a shard)."""
    return TRAINING.draft_window_shards(
        wildcards.variant, wildcards.epoch, wildcards.window
    )


def get_window_count(wildcards):
    """train_draft_window's draft's windows in its epoch (its last one ends the epoch)."""
    return TRAINING.drafts[wildcards.variant].count(int(wildcards.epoch))


def get_previous_window_training_state(wildcards):
    return TRAINING.previous_state(wildcards.epoch, wildcards.window, wildcards.variant)


def get_last_window_training_state(wildcards):
    return TRAINING.last_state(wildcards.variant)


def get_draft_windows(wildcards):
    """plan_windows' windows: per epoch, per window of the draft, its shard entries."""
    return TRAINING.drafts[wildcards.variant].shard_lists()


def get_window_training_runtime(wildcards):
    """train_draft_window's run-time values: train's and the window's shard ids (checked against the
    plan's; known here, not parsed back out of the states' paths)."""
    return runtime_only(
        train=runtime_params(
            SETTINGS.train, "train_draft"
        ),  # as train_draft's (rules/train.smk)
        window={"shards": draft_window_shards(wildcards)},
        engines={"roots": ENGINE_ROOTS},  # as train_draft's (rules/train.smk)
    )


def window_hidden_states(split):
    """An input function: the hidden states of split `split` the draft window reads
    (TrainingWindows.window_states)."""

    def get_window_hidden_states(wildcards):
        return TRAINING.window_states(
            split, wildcards.variant, wildcards.epoch, wildcards.window
        )

    return get_window_hidden_states


def get_validation_states():
    """What offline validation reads: every shard's validation states, or under a cap the last
    window's of the last epoch (still on disk: validation is their last reader)."""
    if not WINDOW:
        return shard_files(
            f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors"
        )
    return TRAINING.validation_states()
