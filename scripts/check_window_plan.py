"""Rule check_window_plan (under hidden_states.max_disk_gb): the plan the workflow was parsed with,
confirmed against every shard's checked traces before the first extraction."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.planning.disk_cap import check_window_plan
from eagle3_pipeline.planning.window_plan import WindowSizing

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

plan = snakemake.params.runtime.section("plan")  # the shards (input.budgets' ids) and the run's folder
check_window_plan(
    planned=snakemake.params.windows,
    sizing=WindowSizing(**snakemake.params.sizing),
    shards=plan["shards"],
    results=plan["results"],
    output=snakemake.output[0],
)
