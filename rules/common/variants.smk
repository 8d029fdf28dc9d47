# The draft variants ({variant}): the main draft, the baseline, the learning-curve points; whose
# states each trains on and which epochs training keeps.
from eagle3_pipeline.budget import DraftWindows
from eagle3_pipeline.validate.learning_curve import (
    curve_points,
    cycled_shards,
    epoch_entries,
    variant_name,
)
from eagle3_pipeline.validate.selection import kept_epochs

# The draft variants, as the {variant} wildcard of the draft's rules (vocab_map .. serve_check): ""
# is the main draft, trained on the target's own traces, at results/{run}/draft/ etc.; "baseline/"
# (validate.baseline) the same rules on the dataset's original answers at results/{run}/baseline/.
BASELINE = "baseline/"
# the baseline's extraction engine (its own scope: nothing of the main draft waits on it)
BASELINE_ENGINE_DIR = f"{WORK}/{BASELINE}hidden_states/engine"
VARIANTS = ["", BASELINE] if SETTINGS.validate.baseline else [""]
# validate.learning_curve: the main draft's rules again on its first k training shards (nested subsets
# of the stable order, on the main draft's hidden states), as the variants learning_curve/shards-{k}/;
# k = every shard is the main draft itself. CURVE: {variant: k} of the points trained apart. A point
# trains as many optimizer steps as the main draft: its epoch reads its k shards cycled to all N
# (variant_train_shards; validate/learning_curve.py).
CURVE_POINTS = curve_points(SETTINGS.validate.learning_curve, len(SHARDS))
CURVE = {variant_name(k, len(SHARDS)): k for k in CURVE_POINTS if k < len(SHARDS)}
VARIANTS += list(CURVE)


def variant_shards(variant):
    """The training shards of a variant: the first k for a learning-curve point, else all."""
    return SHARDS[: CURVE[variant]] if variant in CURVE else SHARDS


def curve_epoch_entries(k):
    """Shard entries in one training epoch of the point of k shards: the main draft's samples in whole
    shards (a last shard under half full is not one), so the point trains the main draft's steps.
    """
    return epoch_entries(SETTINGS.dataset.num_samples, SETTINGS.dataset.shard_size, k)


def variant_train_shards(variant):
    """What one training epoch of a variant reads: a learning-curve point's k shards cycled to the
    main draft's shard count (about N/k passes: the main draft's steps), else its shards.
    """
    if variant in CURVE:
        k = CURVE[variant]
        return cycled_shards(SHARDS, k, curve_epoch_entries(k))
    return variant_shards(variant)


# Under hidden_states.max_disk_gb in windows a point extracts nothing of its own: it trains window by
# window in the main draft's windows that hold some of its shards, reading only those (DraftWindows.point),
# each shard as often per epoch as without a cap; the cap counts its training state files
# (budget.state_files_at_once) and the next window's extraction waits for it too (get_extraction_gate).
if WINDOW:
    DRAFT_WINDOWS |= {
        variant: DraftWindows.point(EPOCH_WINDOWS, SHARDS, k, curve_epoch_entries(k))
        for variant, k in CURVE.items()
    }


def states_of(variant):
    """Whose hidden states a variant trains on: a learning-curve point on the main draft's."""
    return "" if variant in CURVE else variant


# validate.select_every_epochs: the epochs whose weights training keeps, the candidates of
# select_checkpoint (rules/validate.smk); none: the last epoch's weights are exported as trained.
KEPT_EPOCHS = kept_epochs(EPOCHS, SETTINGS.validate.select_every_epochs)


def get_export_weights(wildcards):
    """What export_draft ships: the epoch select_checkpoint chose, else the last epoch's weights."""
    folder = "selected" if KEPT_EPOCHS else "trained"
    return f"{RESULTS}/{wildcards.variant}draft/{folder}/model.safetensors"


def get_export_metadata(wildcards):
    """The first training shard's metadata of the states the variant trained on (its layer numbering
    and final-state kind)."""
    states = f"{RESULTS}/{states_of(wildcards.variant)}hidden_states"
    return f"{states}/{EPOCH_DIR.format(epoch=0)}train/shard-{SHARDS[0]}.json"


def variant_files(*patterns, shards_of=variant_shards):
    """An input function giving, for the job's {variant}, each pattern's file for every shard of
    shards_of(variant) (a pattern's {variant} is the job's); lists made once per variant, as in
    shard_files.
    """
    files = {
        variant: [
            path
            for pattern in patterns
            for shard in shards_of(variant)
            for path in expand(pattern, shard=shard, variant=states_of(variant))
        ]
        for variant in VARIANTS
    }

    def get_variant_files(wildcards):
        return files[wildcards.variant]

    return get_variant_files


def variant_output(output, variant=BASELINE):
    """A draft rule's output pattern (with {variant}) for one variant."""
    return expand(output, variant=variant)[0]


# A variant's training states: its own train split; validation is always the main draft's (the
# target's own validation traces, every shard), so every draft is measured on the same held-out data.
# A learning-curve point trains on its k shards alone (no validation figures in its history), cycled
# to the main draft's N: a shard added later changes N, so every point trains again (at the new steps).
get_variant_train_states = variant_files(
    f"{RESULTS}/{{variant}}hidden_states/train/shard-{{shard}}.safetensors",
    shards_of=variant_train_shards,
)
get_main_validation_states = shard_files(
    f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors"
)


def get_draft_validation_states(wildcards):
    return [] if wildcards.variant in CURVE else get_main_validation_states(wildcards)
