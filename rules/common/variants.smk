# The draft variants ({variant}): the main draft, the baseline, the learning-curve points; whose
# states each trains on and which epochs training keeps (eagle3_pipeline.planning.variants).
from eagle3_pipeline.planning.variants import (
    BASELINE,
    Variants,
    variant_name,
)  # variant_name: rules/validate.smk's
from eagle3_pipeline.validate.selection import kept_epochs

# The draft variants, as the {variant} wildcard of the draft's rules (vocab_map .. serve_check): ""
# is the main draft, trained on the target's own traces, at results/{run}/draft/ etc.; "baseline/"
# (validate.baseline) the same rules on the dataset's original answers at results/{run}/baseline/.
# validate.learning_curve: the main draft's rules again on its first k training shards (nested subsets
# of the stable order, on the main draft's hidden states), as the variants learning_curve/shards-{k}/;
# k = every shard is the main draft itself. CURVE: {variant: k} of the points trained apart. A point
# trains as many optimizer steps as the main draft: its epoch reads its k shards cycled to all N
# (Variants.train_shards; planning/variants.py).
VARIANT_PLAN = Variants.from_settings(SETTINGS, SHARDS, RESULTS)
CURVE_POINTS = VARIANT_PLAN.curve_points
CURVE = VARIANT_PLAN.curve
VARIANTS = VARIANT_PLAN.names


def curve_epoch_entries(k):
    """Shard entries in one training epoch of the point of k shards (Variants.epoch_entries)."""
    return VARIANT_PLAN.epoch_entries(k)


# validate.select_every_epochs: the epochs whose weights training keeps, the candidates of
# select_checkpoint (rules/validate.smk); none: the last epoch's weights are exported as trained.
KEPT_EPOCHS = kept_epochs(SETTINGS.train.epochs, SETTINGS.validate.select_every_epochs)


def get_export_weights(wildcards):
    """What export_draft ships: the epoch select_checkpoint chose, else the last epoch's weights."""
    return VARIANT_PLAN.export_weights(wildcards.variant, selected=bool(KEPT_EPOCHS))


def get_export_metadata(wildcards):
    return VARIANT_PLAN.export_metadata(wildcards.variant, EPOCH_DIR.format(epoch=0))


def variant_files(*patterns, shards_of=VARIANT_PLAN.shards_of):
    """An input function giving, for the job's {variant}, each pattern's file for every shard of
    shards_of(variant) (a pattern's {variant} is whose states it trains on); lists made once per
    variant, as in shard_files.
    """
    files = {
        variant: [
            path
            for pattern in patterns
            for path in expand(
                pattern,
                shard=shards_of(variant),
                variant=VARIANT_PLAN.states_of(variant),
            )
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
    shards_of=VARIANT_PLAN.train_shards,
)
get_main_validation_states = shard_files(
    f"{RESULTS}/hidden_states/validation/shard-{{shard}}.safetensors"
)


def get_draft_validation_states(wildcards):
    if VARIANT_PLAN.is_point(wildcards.variant):
        return []
    return get_main_validation_states(wildcards)
