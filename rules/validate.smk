# Does the served model accept the draft? Offline acceptance on held-out hidden states, and the draft
# actually served by vLLM with its spec-decode counters read from /metrics. Per {variant}: the main
# draft and, with validate.baseline, the baseline (results/{run}/baseline/), on the same validation data.
import os

from eagle3_pipeline.generate.payload import serve_check_params
from eagle3_pipeline.settings import runtime_params, served_max_tokens


rule validate_offline:
    input:
        checkpoint=rules.export_draft.output.config,
        states=get_validation_states(),  # the main draft's: both variants on the same held-out data
        target=get_target_config(),
    output:
        f"{RESULTS}/{{variant}}validation/offline.json",
    log:
        f"{LOGS}/{{variant}}validate_offline.log",
    conda:
        "../envs/pipeline.yaml"
    resources:
        # the draft and the target's lm_head over every validation token; CPU when none
        **gpu_request(1),
    params:
        ttt_steps=SETTINGS.draft.ttt_steps,
        # the slices, and the serve check's run replayed along the traces (validate/slices.py)
        context_buckets=SETTINGS.validate.context_buckets,
        num_speculative_tokens=SETTINGS.validate.num_speculative_tokens,
        served_max_tokens=served_max_tokens(SETTINGS.generation, SETTINGS.validate),
    script:
        "../scripts/validate_offline.py"


if SETTINGS.draft.init_from:

    # draft.init_from: the starting draft through the same offline check, on the same states (the
    # report shows it beside the trained draft)
    rule validate_offline_init:
        input:
            **INIT_FROM,
            states=get_validation_states(),
            target=get_target_config(),
        output:
            f"{RESULTS}/validation/offline_init.json",
        log:
            f"{LOGS}/validate_offline_init.log",
        conda:
            "../envs/pipeline.yaml"
        resources:
            **gpu_request(1),  # as validate_offline
        params:
            draft=DRAFT_PARAMS,  # the run's draft shape, which the starting draft must have
            ttt_steps=SETTINGS.draft.ttt_steps,
            context_buckets=SETTINGS.validate.context_buckets,
            num_speculative_tokens=SETTINGS.validate.num_speculative_tokens,
            served_max_tokens=served_max_tokens(SETTINGS.generation, SETTINGS.validate),
            work=f"{WORK}/init_draft",  # the starting draft as an EAGLE-format folder
        script:
            "../scripts/validate_offline_init.py"


if KEPT_EPOCHS:

    rule select_checkpoint:
        input:
            checkpoints=rules.train_draft.output.checkpoints,
            history=rules.train_draft.output.history,
            vocab_map=rules.vocab_map.output,
            target=get_target_config(),
            hidden_states_metadata=get_export_metadata,
            states=get_validation_states(),  # the main draft's, as validate_offline
        output:
            weights=f"{RESULTS}/{{variant}}draft/selected/model.safetensors",
            selection=f"{RESULTS}/{{variant}}validation/selection.json",
        log:
            f"{LOGS}/{{variant}}select_checkpoint.log",
        conda:
            "../envs/pipeline.yaml"
        threads: 1  # torch threads on CPU, as train_draft (it runs beside the serve checks)
        resources:
            **gpu_request(1),  # as validate_offline, once per kept epoch
        params:
            epochs=KEPT_EPOCHS,
            every=SETTINGS.validate.select_every_epochs,
            ttt_steps=SETTINGS.draft.ttt_steps,
            num_speculative_tokens=SETTINGS.validate.num_speculative_tokens,
        script:
            "../scripts/select_checkpoint.py"


if CURVE_POINTS:

    # validate.learning_curve: one point per subset (rules/common/variants.smk CURVE; k = every shard is
    # the main draft), each trained at the main draft's optimizer steps, with its history (steps) and
    # its offline.json (acceptance with its question-level interval, and the per-question replays the
    # gains between points are paired on): with selection, that of its chosen epoch's export, and
    # selection.json says which epoch; the main draft's history (the steps matched) and the training
    # shards' metadata (each point's training tokens)
    CURVE_INPUTS = {
        f"{kind}_{k}": f"{RESULTS}/{variant_name(k, len(SHARDS))}{path}"
        for k in CURVE_POINTS
        for kind, path in (
            ("history", "draft/trained/history.json"),
            ("offline", "validation/offline.json"),
            *((("selection", "validation/selection.json"),) if KEPT_EPOCHS else ()),
        )
    }

    rule learning_curve:
        input:
            **CURVE_INPUTS,
            full_history=variant_output(rules.train_draft.output.history, ""),
            # under a cap in windows, the first epoch's (each epoch's are the same)
            metadata=shard_files(f"{STATES.format(epoch=0)}/train/shard-{{shard}}.json"),
        output:
            f"{RESULTS}/validation/learning_curve.json",
        log:
            f"{LOGS}/learning_curve.log",
        conda:
            "../envs/pipeline.yaml"
        params:
            points=[
                {"shards": k, "fractions": fractions}
                for k, fractions in CURVE_POINTS.items()
            ],
            shards=len(SHARDS),
            epochs=EPOCHS,
            # shard entries per training epoch of a smaller point (the same for every k < N)
            entries=curve_epoch_entries(1),
            num_speculative_tokens=SETTINGS.validate.num_speculative_tokens,
        script:
            "../scripts/learning_curve.py"


# One draft server at a time (the local demo's port, or production, whose check unit conflicts it), yet
# without ordering the checks: either may fail alone. Snakemake schedules draft_server like cores;
# its limit is 1 unless the command line sets one (`--resources draft_server=N`).
if "draft_server" not in workflow.global_resources:
    workflow.register_resource("draft_server", 1)


rule serve_check:
    input:
        checkpoint=rules.export_draft.output.config,
        validation=rules.split_traces.output.validation,  # the main traces' validation questions
        server=rules.snapshot_server.output.server,
        offline=rules.validate_offline.output[0],  # served acceptance must match it (validate/served_figures.py)
    output:
        f"{RESULTS}/{{variant}}validation/serve_check.json",
    log:
        f"{LOGS}/{{variant}}serve_check.log",
    # before any extraction job that is ready with it (the baseline's): see get_serve_check_resources
    priority: 1
    conda:
        "../envs/pipeline.yaml"
    resources:
        **get_serve_check_resources(),
    params:
        # the requests' sampling and concurrency (the tokens/s compared) and the check's own keys;
        # which server is an input (server.json), reaching and restarting it is run-time only
        generation=serve_check_params(SETTINGS.generation),
        validate=get_serve_check_settings,
        # the sections' other keys (retries, timeouts, remote_dir, speedup_repeats...): the job
        # receives them whole
        runtime=runtime_only(
            server=SERVER,
            generation=runtime_params(SETTINGS.generation, "serve_check"),
            validate=runtime_params(SETTINGS.validate, "serve_check"),
        ),
        work=f"{WORK}/{{variant}}serve_check",  # the vLLM log and pid file of this check
    script:
        "../scripts/serve_check.py"


# What plot_validation draws from: every stage's outputs; the serve checks and the baseline when configured.
REPORT_INPUTS = {
    "unit": rules.snapshot_server.output.unit,
    "server": rules.snapshot_server.output.server,
    "stats": rules.merge_traces.output.stats,
    "traces": rules.merge_traces.output.traces,
    "history": variant_output(rules.train_draft.output.history, ""),
    "offline": variant_output(rules.validate_offline.output[0], ""),
}
if SETTINGS.draft.init_from:
    REPORT_INPUTS["offline_init"] = rules.validate_offline_init.output[0]
if SETTINGS.validate.serve_check:
    REPORT_INPUTS["serve_check"] = variant_output(rules.serve_check.output[0], "")
# validate.select_every_epochs and validate.learning_curve: their curves, and a figure each
CURVE_FIGURES = {}
if KEPT_EPOCHS:
    REPORT_INPUTS["selection"] = variant_output(
        rules.select_checkpoint.output.selection, ""
    )
    CURVE_FIGURES["selection"] = report(
        f"{RESULTS}/report/selection.png",
        caption="../report/selection.rst",
        labels={"figure": "Epoch selection"},
        category="3. Training",
    )
if CURVE_POINTS:
    REPORT_INPUTS["learning_curve"] = rules.learning_curve.output[0]
    CURVE_FIGURES["learning_curve"] = report(
        f"{RESULTS}/report/learning_curve.png",
        caption="../report/learning_curve.rst",
        labels={"figure": "Learning curve"},
        category="4. Validation",
    )
if SETTINGS.validate.baseline:
    REPORT_INPUTS["baseline_history"] = variant_output(rules.train_draft.output.history)
    REPORT_INPUTS["baseline_offline"] = variant_output(rules.validate_offline.output[0])
    if SETTINGS.validate.serve_check:
        REPORT_INPUTS["baseline_serve_check"] = variant_output(
            rules.serve_check.output[0]
        )


# The report opens on this run's verdict (validate/report_front.py) once plot_validation has written it;
# before that, on report/workflow.rst. A stat at parse time, nothing read.
FRONT_PAGE = f"{RESULTS}/report/front.rst"


report: os.path.abspath(FRONT_PAGE) if os.path.exists(FRONT_PAGE) else "../report/workflow.rst"


rule plot_validation:
    input:
        **REPORT_INPUTS,
    output:
        **CURVE_FIGURES,
        front=FRONT_PAGE,
        server=report(
            f"{RESULTS}/report/server.html",
            caption="../report/server.rst",
            labels={"figure": "Server snapshot"},
            category="1. Server",
        ),
        trace_stats=report(
            f"{RESULTS}/report/trace_stats.html",
            caption="../report/trace_stats.rst",
            labels={"figure": "Trace statistics"},
            category="2. Traces",
        ),
        trace_lengths=report(
            f"{RESULTS}/report/trace_lengths.png",
            caption="../report/trace_lengths.rst",
            labels={"figure": "Trace lengths"},
            category="2. Traces",
        ),
        training=report(
            f"{RESULTS}/report/training.png",
            caption="../report/training.rst",
            labels={"figure": "Training"},
            category="3. Training",
        ),
        acceptance=report(
            f"{RESULTS}/report/acceptance.png",
            caption="../report/acceptance.rst",
            labels={"figure": "Acceptance"},
            category="4. Validation",
        ),
        comparison=report(
            f"{RESULTS}/report/comparison.png",
            caption="../report/comparison.rst",
            labels={"figure": "Own traces vs baseline"},
            category="4. Validation",
        ),
        slices=report(
            f"{RESULTS}/report/slices.png",
            caption="../report/slices.rst",
            labels={"figure": "Where the draft is accepted"},
            category="4. Validation",
        ),
        engine=report(
            f"{RESULTS}/report/engine.html",
            caption="../report/engine.rst",
            labels={"figure": "Extraction engine"},
            category="5. Extraction engine",
        ),
    log:
        f"{LOGS}/plot_validation.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        # every engine start's stats, written by the engine jobs (not inputs: records of runs, read as
        # they are; validate/report_engine.py)
        engine_stats=ENGINE_STATS_ROOTS,
    script:
        "../scripts/plot_validation.py"
