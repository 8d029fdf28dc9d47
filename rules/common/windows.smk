# hidden_states.max_disk_gb: the training windows (which shards an epoch's window extracts, trains
# on and deletes) and the training state passed from one window to the next.
import sys

from eagle3_pipeline.budget import (
    capped_window_shards,
    epoch_windows,
    parse_time_hidden_size,
)
from eagle3_pipeline.config import SPLITS, ConfigError
from eagle3_pipeline.settings import TRAIN_RUNTIME_KEYS, as_params, runtime_only

# hidden_states.max_disk_gb: shards per training window, from the config alone (None: no cap, every
# shard's states kept). Under a cap, epoch e's states of window w are extracted, trained on by
# train_draft_window and deleted; a cap below one shard is refused here, with the numbers. The cap
# also holds the two training state files windowed training keeps at once (budget.py).
WINDOW = (
    capped_window_shards(SETTINGS, parse_time_hidden_size(SETTINGS))
    if SETTINGS.hidden_states.max_disk_gb is not None
    else None
)
EPOCHS = SETTINGS.train.epochs
# Per epoch, its windows: the shards in an order seeded by train.seed and the epoch, cut into windows
# of WINDOW (budget.epoch_windows; plan_windows records them), so each epoch groups them anew.
EPOCH_WINDOWS = (
    [epoch_windows(SETTINGS.train.seed, e, SHARDS, WINDOW) for e in range(EPOCHS)]
    if WINDOW
    else []
)
WINDOW_COUNT = len(EPOCH_WINDOWS[0]) if WINDOW else 0  # windows per epoch
SHARD_WINDOW = [
    {k: w for w, shards in enumerate(windows) for k in shards}
    for windows in EPOCH_WINDOWS
]


def window_of(epoch, shard):
    """The window that trains on shard `shard` in epoch `epoch`."""
    return SHARD_WINDOW[int(epoch)][shard]


def window_shards(epoch, window):
    """The shards of window `window` of epoch `epoch`."""
    return EPOCH_WINDOWS[int(epoch)][int(window)]


# The windows form one chain of epochs x windows training jobs, and Snakemake builds its DAG
# recursively (about 3 Python frames per link, measured): room for the chain, as for a long DAG.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 2000 + 10 * EPOCHS * WINDOW_COUNT))
if WINDOW and SETTINGS.validate.baseline:
    raise ConfigError(
        "hidden_states.max_disk_gb with validate.baseline: the baseline draft is not trained in "
        "windows; set validate.baseline: false (or hidden_states.max_disk_gb: null)"
    )
# Where extraction writes: one folder per epoch under a cap (each epoch extracts anew)
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
        return [window_training_state(epoch - 1, WINDOW_COUNT - 1)]
    return []


def get_extraction_gate(wildcards):
    """Under a cap, shard k of epoch e is extracted only once the previous window is trained on (and
    its states deleted): the disk never holds two windows."""
    if not WINDOW:
        return []
    epoch = int(wildcards.epoch)
    return previous_window_training_state(epoch, window_of(epoch, wildcards.shard))


def get_previous_window_training_state(wildcards):
    return previous_window_training_state(int(wildcards.epoch), int(wildcards.window))


def get_window_training_runtime(wildcards):
    """train_draft_window's run-time values: train's and the window's shard ids (checked against the
    plan's; known here, not parsed back out of the states' paths)."""
    return runtime_only(
        train=as_params(SETTINGS.train, *TRAIN_RUNTIME_KEYS),
        window={"shards": window_shards(wildcards.epoch, wildcards.window)},
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
    return [
        f"{RESULTS}/hidden_states/epoch-{EPOCHS - 1}/validation/shard-{k}.safetensors"
        for k in window_shards(EPOCHS - 1, WINDOW_COUNT - 1)
    ]
