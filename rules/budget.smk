# The hidden-state disk budget, checked before any extraction job starts: the real sequence lengths of
# the traces x 4 hidden states x hidden size, against the free space of the results filesystem. Fails
# early with the numbers instead of a full disk hours into extraction. A run also prints the config's
# upper bound as it starts (not on dry runs: nothing is read at parse time but the target's config.json).
from eagle3_pipeline.budget import budget_at_start


onstart:
    logger.info(budget_at_start(config, RESULTS))


localrules:
    check_disk_budget,


rule check_disk_budget:
    input:
        train=rules.split_traces.output.train,
        validation=rules.split_traces.output.validation,
        target=get_target_config(),
    output:
        f"{RESULTS}/budget/hidden_states.json",
    log:
        f"{LOGS}/check_disk_budget.log",
    params:
        hidden_states=f"{RESULTS}/hidden_states",
        max_seq_len=config["hidden_states"]["max_seq_len"],
        overlong=config["hidden_states"]["overlong"],
        dtype=config["hidden_states"]["dtype"],
    script:
        "../scripts/check_disk_budget.py"
