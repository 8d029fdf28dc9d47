# The served check's scheduling (what it holds while it runs) and the validate.* keys each variant's
# check records.
from eagle3_pipeline.settings import rerun_params


def get_serve_check_resources():
    """draft_server, and what keeps the check's timing its own: the served check must not share the
    box with an extraction engine at work or a GPU job. With validate.baseline, the baseline's
    extraction becomes ready with the main check (both wait for the main offline validation,
    get_baseline_extraction_gate); the check goes first (its priority) and holds the extraction-engine
    slot (resource extraction_engines), so no engine job starts beside it. The baseline's engine job
    runs after the check, with its extraction jobs, and ends before the baseline trains; the check
    cannot become ready later (every input of it is done before the gate). Locally the check's vLLM runs on
    this box's accelerators: it holds all of them (resource gpu). Resources, not a DAG edge: the main
    draft never waits on the baseline, so toggling validate.baseline replans none of its jobs.
    """
    resources = {"draft_server": 1}
    if VLLM_ENGINE:
        resources["extraction_engines"] = resource_limit("extraction_engines")
    gpus = resource_limit("gpu")
    if SETTINGS.server.host == "local" and isinstance(gpus, int):
        resources["gpu"] = gpus
    return resources


def get_serve_check_settings(wildcards):
    """The check's own validate.* keys. validate.speedup and validate.by_k_max for the main draft only:
    the target alone, timed on the same questions, is the same run for every variant, and the report
    shows the main draft's speedup and curve; the baseline is compared by acceptance (vLLM starts and
    timed runs saved).
    """
    keys = rerun_params(SETTINGS.validate, "serve_check")
    # served acceptance against k (one vLLM start per k): the main draft's, recorded only when on, last
    by_k_max = keys.pop("by_k_max", None)
    if wildcards.variant == BASELINE:
        keys["speedup"] = False
    elif by_k_max:
        keys["by_k_max"] = by_k_max
    return keys
