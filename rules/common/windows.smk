# hidden_states.max_disk_gb: the plan under the cap (budget.WindowPlan), made when the workflow is
# parsed: one extraction pass whose states stay for every epoch when every shard fits the cap at once,
# else the training windows (which shards an epoch's window extracts, trains on and deletes) and the
# training state passed from one window to the next.
import sys

from eagle3_pipeline.budget import parse_time_hidden_size, window_plan
from eagle3_pipeline.config import SPLITS, ConfigError
from eagle3_pipeline.settings import TRAIN_RUNTIME_KEYS, as_params, runtime_only

CAPPED = SETTINGS.hidden_states.max_disk_gb is not None
# Each shard sized from its traces' real tokens where its check_disk_budget record is up to date
# (budget.traced_states: a stat and a small JSON per shard), else at its config bound (every sample as
# long as max_seq_len); a cap below one shard's bound is refused here, with the numbers. The cap also
# holds the two training state files training keeps at once (budget.py). A run planned before the
# traces were checked stops before its first extraction when they plan otherwise (check_window_plan,
# rules/budget.smk): the next run plans from them.
WINDOW_PLAN = (
    window_plan(SETTINGS, parse_time_hidden_size(SETTINGS), SHARDS, RESULTS)
    if CAPPED
    else None
)
# Per epoch, its windows (none for one pass): the shards in an order seeded by train.seed and the
# epoch, cut into windows that fit the cap (budget.sized_windows; plan_windows records them), so each
# epoch groups them anew; the count can differ between epochs when the shards differ in size.
EPOCH_WINDOWS = (WINDOW_PLAN.windows or []) if CAPPED else []
EPOCHS = SETTINGS.train.epochs
# shards in the largest window; None: no windows (uncapped, or one pass under the cap)
WINDOW = WINDOW_PLAN.largest_window if EPOCH_WINDOWS else None
SHARD_WINDOW = [
    {k: w for w, shards in enumerate(windows) for k in shards}
    for windows in EPOCH_WINDOWS
]


def window_count(epoch):
    """Windows in epoch `epoch`."""
    return len(EPOCH_WINDOWS[int(epoch)])


def window_of(epoch, shard):
    """The window that trains on shard `shard` in epoch `epoch`."""
    return SHARD_WINDOW[int(epoch)][shard]


def window_shards(epoch, window):
    """The shards of window `window` of epoch `epoch`."""
    return EPOCH_WINDOWS[int(epoch)][int(window)]


# The windows form one chain of every epoch's windows' training jobs, and Snakemake builds its DAG
# recursively (about 3 Python frames per link, measured): room for the chain, as for a long DAG.
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


def window_training_state(epoch, window):
    """The training state (weights, optimiser, schedule) after window `window` of epoch `epoch` (a temp
    file: kept until used)."""
    return f"{RESULTS}/draft/windows/epoch-{epoch}/window-{window}.pt"


def previous_window_training_state(epoch, window):
    """The training state a window starts from: the previous window's, the last of the previous epoch,
    or none."""
    if window > 0:
        return [window_training_state(epoch, window - 1)]
    if epoch > 0:
        return [window_training_state(epoch - 1, window_count(epoch - 1) - 1)]
    return []


def last_window_training_state():
    """The training state after the last window of the last epoch."""
    return window_training_state(EPOCHS - 1, window_count(EPOCHS - 1) - 1)


# check_window_plan's record (rules/budget.smk): the plan confirmed against the checked traces
WINDOW_PLAN_CHECK = f"{RESULTS}/budget/window_plan.json"


def get_extraction_gate(wildcards):
    """Under a cap, no shard is extracted before check_window_plan confirmed the plan from the traces
    (ancient: a later change of it reruns no done shard), and in windows shard k of epoch e only once
    the previous window is trained on (and its states deleted): the disk never holds two windows.
    """
    if not CAPPED:
        return []
    if not WINDOW:
        return [ancient(WINDOW_PLAN_CHECK)]
    epoch = int(wildcards.epoch)
    previous = previous_window_training_state(epoch, window_of(epoch, wildcards.shard))
    return previous or [ancient(WINDOW_PLAN_CHECK)]


def get_window_count(wildcards):
    """train_draft_window's windows in its epoch (its last one ends the epoch)."""
    return window_count(wildcards.epoch)


def get_previous_window_training_state(wildcards):
    return previous_window_training_state(int(wildcards.epoch), int(wildcards.window))


def get_window_training_runtime(wildcards):
    """train_draft_window's run-time values: train's and the window's shard ids (checked against the
    plan's; known here, not parsed back out of the states' paths)."""
    return runtime_only(
        train=as_params(SETTINGS.train, *TRAIN_RUNTIME_KEYS),
        window={"shards": window_shards(wildcards.epoch, wildcards.window)},
        engines={"roots": ENGINE_ROOTS},  # as train_draft's (rules/train.smk)
    )


def window_hidden_states(split):
    """An input function: epoch e's hidden states of split `split` of window w's shards, in shard order."""

    def get_window_hidden_states(wildcards):
        return [
            f"{RESULTS}/hidden_states/epoch-{wildcards.epoch}/{split}/shard-{k}.safetensors"
            for k in window_shards(wildcards.epoch, wildcards.window)
        ]

    return get_window_hidden_states


def get_validation_states():
    """What offline validation reads: every shard's validation states, or under a cap the last
    window's of the last epoch (still on disk: validation is their last reader)."""
    if not WINDOW:
        return shard_files(
            f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors"
        )
    last = EPOCHS - 1
    return [
        f"{RESULTS}/hidden_states/epoch-{last}/validation/shard-{k}.safetensors"
        for k in window_shards(last, window_count(last) - 1)
    ]
