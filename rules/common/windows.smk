# hidden_states.max_disk_gb: the plan under the cap (budget.WindowPlan), made when the workflow is
# parsed: one extraction pass whose states stay for every epoch when every shard fits the cap at once,
# else the training windows (which shards an epoch's window extracts, trains on and deletes) and the
# training state passed from one window to the next.
import sys

from eagle3_pipeline.budget import DraftWindows, parse_time_hidden_size, window_plan
from eagle3_pipeline.config import ConfigError
from eagle3_pipeline.settings import TRAIN_RUNTIME_KEYS, as_params, runtime_only

CAPPED = SETTINGS.hidden_states.max_disk_gb is not None
# Each shard sized from its traces' real tokens where its check_disk_budget record is up to date
# (budget.traced_states: a stat and a small JSON per shard), else at its config bound (every sample as
# long as max_seq_len); a cap below one shard's bound is refused here, with the numbers. The cap also
# holds the two training state files each draft's training keeps at once (budget.py). A run planned before the
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
# {variant}: the windows each draft trains in (budget.DraftWindows): the main draft's here, every
# window; rules/common/variants.smk adds each learning-curve point's (those holding its shards)
DRAFT_WINDOWS = {"": DraftWindows.main(EPOCH_WINDOWS)} if WINDOW else {}


def window_of(epoch, shard):
    """The window that trains on shard `shard` in epoch `epoch`."""
    return SHARD_WINDOW[int(epoch)][shard]


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
    """The training state (weights, optimiser, schedule) of draft `variant` after its window `window` of
    epoch `epoch` (a temp file: kept until used)."""
    return f"{RESULTS}/{variant}draft/windows/epoch-{epoch}/window-{window}.pt"


def previous_window_training_state(epoch, window, variant=""):
    """The training state a draft's window starts from: its previous window's, the last of the previous
    epoch, or none."""
    previous = DRAFT_WINDOWS[variant].previous(int(epoch), int(window))
    return [window_training_state(*previous, variant)] if previous else []


def last_window_training_state(variant=""):
    """The training state after a draft's last window of the last epoch."""
    return window_training_state(*DRAFT_WINDOWS[variant].last(), variant)


def window_trained(epoch, window):
    """The training states of every draft's window that reads the plan's window `window` of epoch
    `epoch`: once they exist, nothing reads its states any more (the main draft and each learning-curve
    point; rules/common/variants.smk DRAFT_WINDOWS)."""
    states = []
    for variant, windows in DRAFT_WINDOWS.items():
        reading = windows.reading(epoch, window)
        if reading is not None:
            states.append(window_training_state(epoch, reading, variant))
    return states


# check_window_plan's record (rules/budget.smk): the plan confirmed against the checked traces
WINDOW_PLAN_CHECK = f"{RESULTS}/budget/window_plan.json"


def get_extraction_gate(wildcards):
    """Under a cap, no shard is extracted before check_window_plan confirmed the plan from the traces
    (ancient: a later change of it reruns no done shard), and in windows shard k of epoch e only once
    every draft that reads the previous window trained on it (and its states are deleted): the disk
    never holds two windows.
    """
    if not CAPPED:
        return []
    if not WINDOW:
        return [ancient(WINDOW_PLAN_CHECK)]
    previous = DRAFT_WINDOWS[""].previous(
        int(wildcards.epoch), window_of(wildcards.epoch, wildcards.shard)
    )
    return window_trained(*previous) if previous else [ancient(WINDOW_PLAN_CHECK)]


def draft_window_shards(wildcards):
    """The shard entries train_draft_window's draft reads in its window (a learning-curve point's may
    repeat a shard)."""
    windows = DRAFT_WINDOWS[wildcards.variant]
    return windows.shards(int(wildcards.epoch), int(wildcards.window))


def get_window_count(wildcards):
    """train_draft_window's draft's windows in its epoch (its last one ends the epoch)."""
    return DRAFT_WINDOWS[wildcards.variant].count(int(wildcards.epoch))


def get_previous_window_training_state(wildcards):
    return previous_window_training_state(
        wildcards.epoch, wildcards.window, wildcards.variant
    )


def get_last_window_training_state(wildcards):
    return last_window_training_state(wildcards.variant)


def get_draft_windows(wildcards):
    """plan_windows' windows: per epoch, per window of the draft, its shard entries."""
    return DRAFT_WINDOWS[wildcards.variant].shard_lists()


def get_window_training_runtime(wildcards):
    """train_draft_window's run-time values: train's and the window's shard ids (checked against the
    plan's; known here, not parsed back out of the states' paths)."""
    return runtime_only(
        train=as_params(SETTINGS.train, *TRAIN_RUNTIME_KEYS),
        window={"shards": draft_window_shards(wildcards)},
        engines={"roots": ENGINE_ROOTS},  # as train_draft's (rules/train.smk)
    )


def window_hidden_states(split):
    """An input function: the hidden states of split `split` the draft's window reads (epoch e's, of
    its shard entries, in order): none of the validation split for a learning-curve point (it records
    no validation figures, as without a cap)."""

    def get_window_hidden_states(wildcards):
        if split == "validation" and wildcards.variant in CURVE:
            return []
        return [
            f"{RESULTS}/hidden_states/epoch-{wildcards.epoch}/{split}/shard-{k}.safetensors"
            for k in draft_window_shards(wildcards)
        ]

    return get_window_hidden_states


def get_validation_states():
    """What offline validation reads: every shard's validation states, or under a cap the last
    window's of the last epoch (still on disk: validation is their last reader)."""
    if not WINDOW:
        return shard_files(
            f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors"
        )
    epoch, window = DRAFT_WINDOWS[""].last()
    return [
        f"{RESULTS}/hidden_states/epoch-{epoch}/validation/shard-{k}.safetensors"
        for k in DRAFT_WINDOWS[""].shards(epoch, window)
    ]
