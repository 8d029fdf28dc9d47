# The hidden-state disk budget, checked per shard before its extraction job starts: the real sequence
# lengths of shard k's traces x 4 hidden states x hidden size, against the free space of the results
# filesystem (and hidden_states.max_disk_gb). Per shard, so that adding shards checks only the new ones
# and no done extraction waits on (or reruns after) a check of the whole corpus. A run prints the
# corpus's upper bound as it starts (not on dry runs: nothing is read at parse time but the target's
# config.json), and a cap smaller than one shard's states is refused when the workflow is parsed.
from dataclasses import asdict

from eagle3_pipeline.budget import budget_at_start


onstart:
    logger.info(budget_at_start(SETTINGS, RESULTS, WINDOW_PLAN))


localrules:
    check_disk_budget,


rule check_disk_budget:
    input:
        train=rules.filter_traces.output.train,
        validation=rules.filter_traces.output.validation,
        target=get_target_config(),
    output:
        f"{RESULTS}/budget/hidden_states/shard-{{shard}}.json",
    log:
        f"{LOGS}/check_disk_budget/{{shard}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        hidden_states=f"{RESULTS}/hidden_states",
        max_seq_len=SETTINGS.hidden_states.max_seq_len,
        overlong=SETTINGS.hidden_states.overlong,
        dtype=SETTINGS.hidden_states.dtype,
        max_disk_gb=SETTINGS.hidden_states.max_disk_gb,
    script:
        "../scripts/check_disk_budget.py"


if CAPPED:

    localrules:
        check_window_plan,

    # Under hidden_states.max_disk_gb, before the first extraction: the plan the workflow was parsed
    # with (WINDOW_PLAN, rules/common/windows.smk; its shards sized from the checked traces that
    # existed then) is the one every shard's checked traces give now. A run planned before they were
    # checked stops here, before extracting anything, when they plan otherwise (one pass where the
    # config's bound needed windows, say): the next run plans from them. States of another plan's
    # layout still on disk (uncounted in the cap) stop it too. Extraction takes its output ancient.
    rule check_window_plan:
        input:
            budgets=shard_files(f"{RESULTS}/budget/hidden_states/shard-{{shard}}.json"),
        output:
            WINDOW_PLAN_CHECK,
        log:
            f"{LOGS}/check_window_plan.log",
        conda:
            "../envs/pipeline.yaml"
        params:
            windows=WINDOW_PLAN.windows,  # None: one pass
            sizing=asdict(WINDOW_PLAN.sizing),
            # input.budgets' shard ids and the run's folder (its traces and states): not rerun triggers
            runtime=runtime_only(plan={"shards": SHARDS, "results": RESULTS}),
        script:
            "../scripts/check_window_plan.py"
