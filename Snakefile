# eagle3-pipeline: from a served vLLM reasoning model to an EAGLE-3 draft it accepts.
#
# results/{run}/
#   server/        unit.service (redacted `systemctl cat`), server.json, identity.json
#   prompts/       shard-{k:05d}.parquet, skipped.parquet
#   generations/   shard-{k:05d}.parquet (one row per prompt: ok | skipped | failed)
#   traces/        traces.parquet, train.parquet, validation.parquet, stats.json, conversations.jsonl
#   budget/        hidden_states.json (disk need, checked against free space before extraction)
#   hidden_states/ {split}/shard-{k:05d}.safetensors (+ .json metadata)
#   draft/         vocab_map.safetensors, trained/, checkpoint/ (EAGLE-3, loadable by vLLM and SGLang)
#   validation/    offline.json, serve_check.json
#   report/        the pictures of `snakemake --report`
#   baseline/      the same draft trained on the dataset's original answers (validate.baseline)
#   work/          resumable state: generation journals, training state
#   logs/          one log per job
# resources/demo/  the embedded demo's tiny target and its systemd unit (demo.enabled)

from snakemake.utils import min_version

min_version("9.0")


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


rule all:
    default_target: True
    input:
        get_final_outputs(),
