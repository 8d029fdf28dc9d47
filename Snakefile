# eagle3-pipeline: from a served vLLM reasoning model to an EAGLE-3 draft it accepts.
#
# results/{run}/
#   server/        unit.service (redacted `systemctl cat`), server.json, identity.json
#                  replicas/{name}/ (server.replicas: the same, checked identical to the primary)
#   prompts/       selection-{b:05d}.parquet (blocks of 64 shards), shard-{k:05d}.parquet, skipped-{b}
#   generations/   shard-{k:05d}.parquet (one row per prompt: ok | skipped | failed)
#   traces/        shards/{split}/shard-{k:05d}.parquet, traces.parquet, train.parquet,
#                  validation.parquet, stats.json, conversations.jsonl
#   budget/        hidden_states/shard-{k:05d}.json (disk need, checked before shard k's extraction);
#                  window_plan.json (under hidden_states.max_disk_gb: the plan checked against them)
#   hidden_states/ {split}/shard-{k:05d}.safetensors (+ .json metadata); under hidden_states.max_disk_gb
#                  epoch-{e}/{split}/..., deleted once trained on
#   draft/         vocab_map.safetensors, windows/ (under a cap), trained/ (epochs/: the kept epochs),
#                  selected/ (the epoch chosen by acceptance), checkpoint/ (EAGLE-3), speculators/
#   validation/    offline.json, serve_check.json, selection.json, learning_curve.json
#   report/        the pictures of `snakemake --report`
#   baseline/      validate.baseline: the draft's rules again as {variant} baseline/ (main: ""), trained
#                  on the dataset's original answers: traces/shards/train/, hidden_states/train/, draft/,
#                  validation/ (logs/baseline/, work/baseline/)
#   learning_curve/shards-{k}/  validate.learning_curve: the draft's rules on the first k shards
#   work/          resumable state: generation journals, training state
#   logs/          one log per job
# resources/demo/  the embedded demo's tiny target and its systemd unit (demo.enabled)

from snakemake.utils import min_version

from eagle3_pipeline.fixes import print_failures
from eagle3_pipeline.snakemake_ancient_fix import install as mask_like_the_rerun_walk
from eagle3_pipeline.snakemake_groups_fix import install as check_each_group_once
from eagle3_pipeline.snakemake_producer_fix import install as known_producers_at_once
from eagle3_pipeline.snakemake_ready_fix import install as ready_once_per_group
from eagle3_pipeline.snakemake_script_fix import install as read_each_script_once
from eagle3_pipeline.snakemake_signature_fix import install as keep_signatures
from eagle3_pipeline.snakemake_toposort_fix import install as order_pipe_groups

min_version("9.0")
# Snakemake 9 checks a job group once per member (n^2 walks): most of a large plan's time with the
# extraction engine's groups (src/eagle3_pipeline/snakemake_groups_fix.py)
check_each_group_once()
# ...and asks whether a group is ready member by member, again for each member (n^2 walks of a
# 1,000-job engine group): src/eagle3_pipeline/snakemake_ready_fix.py
ready_once_per_group()
# ...and orders a group's pipe group (the engine's service() and its clients) in n^2 comparisons:
# src/eagle3_pipeline/snakemake_toposort_fix.py
order_pipe_groups()
# Snakemake 9 never checks a job behind an ancient input downstream of one that reruns: the baseline's
# training missed a changed key until the next run (src/eagle3_pipeline/snakemake_ancient_fix.py)
mask_like_the_rerun_walk()
# Per job: Snakemake 9 scans a producer's inputs for each consumer (stop_server's, one per shard, for
# every extraction job: n^2), reads the rule's script and inspects each function it calls (input,
# params, resources) anew: src/eagle3_pipeline/snakemake_{producer,script,signature}_fix.py
known_producers_at_once()
read_each_script_once()
keep_signatures()


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/demo.smk"
include: "rules/server.smk"
include: "rules/prompts.smk"
include: "rules/generate.smk"
include: "rules/traces.smk"
include: "rules/budget.smk"
include: "rules/hidden_states.smk"
include: "rules/train.smk"
include: "rules/validate.smk"
include: "rules/demo_head_to_head.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),


# a failed job's last `ERROR: ... (fix: <config key or file>)` line, again after Snakemake's own report
onerror:
    print_failures(log)
