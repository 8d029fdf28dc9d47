# The Kimi-family demo's head-to-head (demo.family kimi): a Llama draft trained on the MLA draft's own
# states (the main draft's hidden states, vocabulary map and training settings; only the attention
# differs), selected, exported and measured offline on the same validation states by the main draft's
# own rules (`use rule`), and validation/head_to_head.json comparing the two (demo/head_to_head.py), with
# its page in the report (report/head_to_head.html, validate/report_head_to_head.py).
# Included after rules/validate.smk (the rules it reuses); DEMO_OUTPUTS (rules/demo.smk) puts the
# comparison into rule all.
from types import SimpleNamespace

# the selection and the export are the main draft's rules: with a cap (windows) or no epoch kept there is
# none to reuse, and the Kimi demo's config has neither
HEAD_TO_HEAD = (
    SETTINGS.demo.enabled
    and SETTINGS.demo.family == "kimi"
    and not WINDOW
    and bool(KEPT_EPOCHS)
)
# the main draft's settings, a Llama layer of the target's heads instead of its MLA
HEAD_TO_HEAD_DRAFT = DRAFT_PARAMS | {
    "architecture": "llama",
    "head_dim": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}

if HEAD_TO_HEAD:
    EXTRA_FINAL_OUTPUTS.append(f"{RESULTS}/validation/head_to_head.json")
    H2H = f"{RESULTS}/head_to_head/llama"
    MAIN = SimpleNamespace(
        variant=""
    )  # the main draft's wildcards, for its input functions
    LLAMA_TRAIN_STATES = expand(
        f"{RESULTS}/hidden_states/train/shard-{{shard}}.safetensors", shard=SHARDS
    )

    use rule train_draft as head_to_head_train_llama with:
        input:
            train_states=LLAMA_TRAIN_STATES,
            validation_states=get_main_validation_states(MAIN),
            vocab_map=variant_output(rules.vocab_map.output[0], ""),
            target=get_target_config(),
            corpus=rules.merge_traces.output.stats,
        output:
            checkpoints=[
                f"{H2H}/trained/epochs/epoch-{e:03d}.safetensors" for e in KEPT_EPOCHS
            ],
            weights=f"{H2H}/trained/model.safetensors",
            history=f"{H2H}/trained/history.json",
        log:
            f"{LOGS}/head_to_head/train_llama.log",
        params:
            **KEPT,
            draft=HEAD_TO_HEAD_DRAFT,
            train=TRAIN_PARAMS,
            runtime=TRAIN_RUNTIME,
            work=f"{WORK}/head_to_head/train",

    use rule select_checkpoint as head_to_head_select_llama with:
        input:
            checkpoints=rules.head_to_head_train_llama.output.checkpoints,
            history=rules.head_to_head_train_llama.output.history,
            vocab_map=variant_output(rules.vocab_map.output[0], ""),
            target=get_target_config(),
            hidden_states_metadata=get_export_metadata(MAIN),
            states=get_validation_states(),
        output:
            weights=f"{H2H}/selected/model.safetensors",
            selection=f"{H2H}/validation/selection.json",
        log:
            f"{LOGS}/head_to_head/select_llama.log",

    use rule export_draft as head_to_head_export_llama with:
        input:
            weights=rules.head_to_head_select_llama.output.weights,
            vocab_map=variant_output(rules.vocab_map.output[0], ""),
            target=get_target_config(),
            hidden_states_metadata=get_export_metadata(MAIN),
        output:
            config=f"{H2H}/checkpoint/config.json",
            weights=f"{H2H}/checkpoint/model.safetensors",
            speculators_config=f"{H2H}/speculators/config.json",
            speculators_weights=f"{H2H}/speculators/model.safetensors",
        log:
            f"{LOGS}/head_to_head/export_llama.log",

    use rule validate_offline as head_to_head_validate_llama with:
        input:
            checkpoint=rules.head_to_head_export_llama.output.config,
            states=get_validation_states(),
            target=get_target_config(),
        output:
            f"{H2H}/validation/offline.json",
        log:
            f"{LOGS}/head_to_head/validate_llama.log",

    rule head_to_head:
        input:
            **(
                {"mla_served": variant_output(rules.serve_check.output[0], "")}
                if SETTINGS.validate.serve_check
                else {}
            ),
            mla_config=variant_output(rules.export_draft.output.config, ""),
            mla_offline=variant_output(rules.validate_offline.output[0], ""),
            llama_config=rules.head_to_head_export_llama.output.config,
            llama_offline=rules.head_to_head_validate_llama.output[0],
            mla_selection=variant_output(rules.select_checkpoint.output.selection, ""),
            llama_selection=rules.head_to_head_select_llama.output.selection,
        output:
            json=f"{RESULTS}/validation/head_to_head.json",
            page=report(
                f"{RESULTS}/report/head_to_head.html",
                caption="../report/head_to_head.rst",
                labels={"figure": "MLA vs Llama draft"},
                category="4. Validation",
            ),
        log:
            f"{LOGS}/head_to_head/compare.log",
        conda:
            "../envs/pipeline.yaml"
        params:
            num_speculative_tokens=SETTINGS.validate.num_speculative_tokens,
        script:
            "../scripts/demo_head_to_head.py"
