# The EAGLE-3 draft: a draft vocabulary from loss-masked token counts, training-time-test training
# launched by accelerate (state under work/ for resume), and export to the EAGLE/SpecForge format.
# Under a disk cap (hidden_states.max_disk_gb) training runs window by window (train_draft_window,
# one job per epoch and window, its state carried in a file) and train_draft writes the last state out.
from eagle3_pipeline.draft.init_files import checkpoint_files
from eagle3_pipeline.settings import rerun_params, runtime_params

# hidden_states.max_seq_len and overlong (settings.Lengths)
LENGTHS = rerun_params(SETTINGS.hidden_states, "vocab_map")
# train.save_every_steps, activation_checkpointing and fsdp are not properties of the weights (train.py
# leaves them out of the resume fingerprint too): run-time only, changing them reruns nothing
TRAIN_PARAMS = rerun_params(SETTINGS.train, "train_draft")
# engines: where a training job waits for an extraction engine still exiting on this host (its GPUs)
TRAIN_RUNTIME = runtime_only(
    train=runtime_params(SETTINGS.train, "train_draft"),
    engines={"roots": ENGINE_ROOTS},
)
# EAGLE-3.1's norm keys only when on: off is the draft trained before they existed, not retrained;
# draft.init_from likewise only when set (both `later` in settings.py). draft.architecture is recorded
# as configured (auto, llama, deepseek_mla): what auto resolves to follows from the target's
# config.json, an input of these rules (a new target reruns them), and resolving it here would need
# that file when the workflow is parsed, which the demo builds in the same run and a plan without
# weights lacks: the param would change between two invocations and retrain a finished draft.
DRAFT_PARAMS = rerun_params(SETTINGS.draft, "train_draft")
# draft.init_from: the starting draft's files are inputs of training (a new or changed one retrains)
INIT_FROM = (
    {"init_from": checkpoint_files(SETTINGS.draft.init_from)}
    if SETTINGS.draft.init_from
    else {}
)


# the speculators folder's verifier: target.hub_id, a param only when set (`later` in settings.py:
# unset, export_draft's jobs are what they were before the key existed); unset, the export takes it from
# the target's folder (input.target: its hub id when it is a hub cache snapshot, else its path)
VERIFIER = rerun_params(SETTINGS.target, "export_draft")


TRAIN_TRACES = shard_files(f"{RESULTS}/traces/shards/train/shard-{{shard}}.parquet")
# validate.select_every_epochs (KEPT_EPOCHS, rules/common/variants.smk): only when on do the training rules get
# the param and outputs (off, their jobs are what they were before the key existed).
EPOCH_CHECKPOINTS = [
    f"{RESULTS}/{{variant}}draft/trained/epochs/epoch-{e:03d}.safetensors"
    for e in KEPT_EPOCHS
]
KEPT = {"checkpoint_epochs": KEPT_EPOCHS} if KEPT_EPOCHS else {}
KEPT_OUTPUTS = {"checkpoints": EPOCH_CHECKPOINTS} if KEPT_EPOCHS else {}
# under a cap, the finishing rule also reads where the windows kept them
KEPT_FINISH = KEPT | {"work": f"{WORK}/{{variant}}train"} if KEPT_EPOCHS else {}


rule vocab_map:
    input:
        # under a cap no state exists before training starts: count from the variant's training traces
        **(
            {
                "traces": variant_files(
                    f"{RESULTS}/traces/shards/train/shard-{{shard}}.parquet"
                )
            }
            if WINDOW
            else {
                "metadata": variant_files(
                    f"{RESULTS}/{{variant}}hidden_states/train/shard-{{shard}}.json"
                )
            }
        ),
        target=get_target_config(),
    output:
        f"{RESULTS}/{{variant}}draft/vocab_map.safetensors",
    log:
        f"{LOGS}/{{variant}}vocab_map.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        **rerun_params(SETTINGS.draft, "vocab_map"),  # draft_vocab_size
        lengths=LENGTHS,
    script:
        "../scripts/vocab_map.py"


if WINDOW:

    # per draft ({variant}: the main draft and each learning-curve point), its windows' batches
    rule plan_windows:
        input:
            traces=TRAIN_TRACES,
        output:
            f"{RESULTS}/{{variant}}draft/windows/plan.json",
        log:
            f"{LOGS}/{{variant}}plan_windows.log",
        conda:
            "../envs/pipeline.yaml"
        params:
            windows=get_draft_windows,  # per epoch, per window of the draft, its shard entries
            # settings.Batching and settings.Lengths
            train=rerun_params(SETTINGS.train, "plan_windows"),
            lengths=rerun_params(SETTINGS.hidden_states, "plan_windows"),
            # input.traces' shard ids: known here, not parsed back out of the paths
            runtime=runtime_only(traces={"shards": SHARDS}),
        script:
            "../scripts/plan_windows.py"

    rule train_draft_window:
        input:
            **INIT_FROM,
            train_states=window_hidden_states("train"),
            validation_states=window_hidden_states("validation"),
            previous=get_previous_window_training_state,
            plan=rules.plan_windows.output,
            vocab_map=rules.vocab_map.output,
            target=get_target_config(),
            corpus=rules.merge_traces.output.stats,
        output:
            state=temp(window_training_state("{epoch}", "{window}", "{variant}")),
        log:
            f"{LOGS}/{{variant}}train_draft_window/epoch-{{epoch}}/{{window}}.log",
        conda:
            "../envs/pipeline.yaml"
        threads: 1  # as train_draft
        resources:
            **gpu_request(1),  # as train_draft
        params:
            **KEPT,
            draft=DRAFT_PARAMS,
            train=TRAIN_PARAMS,
            # with the window's shard ids, which the job checks against the plan's
            runtime=get_window_training_runtime,
            # also the main-process port's key: the same for every window of a draft (they run one
            # at a time), another for each draft
            work=f"{WORK}/{{variant}}train",
            windows=get_window_count,  # the draft's in its epoch: its last one ends the epoch
        script:
            # a job file under work/ run by `accelerate launch` (eagle3_pipeline.launch)
            "../scripts/train_draft_window.py"

    localrules:
        train_draft,  # a state file written out: no GPU, no cluster job

    rule train_draft:
        input:
            state=get_last_window_training_state,
            vocab_map=rules.vocab_map.output,
            target=get_target_config(),
        output:
            **KEPT_OUTPUTS,
            # {variant}: the main draft and the learning-curve points (the baseline is refused under a cap)
            weights=f"{RESULTS}/{{variant}}draft/trained/model.safetensors",
            history=f"{RESULTS}/{{variant}}draft/trained/history.json",
        log:
            f"{LOGS}/{{variant}}train_draft.log",
        conda:
            "../envs/pipeline.yaml"
        params:
            **KEPT_FINISH,
            target=SETTINGS.target.model,
            draft=DRAFT_PARAMS,
            train=TRAIN_PARAMS,
            runtime=TRAIN_RUNTIME,
        script:
            "../scripts/finish_draft_training.py"

else:

    rule train_draft:
        input:
            **INIT_FROM,
            train_states=get_variant_train_states,
            # none for a learning-curve point
            validation_states=get_draft_validation_states,
            vocab_map=rules.vocab_map.output,
            target=get_target_config(),
            # the corpus-wide checks (an id in two shards) pass before training; extraction never waits
            corpus=rules.merge_traces.output.stats,
        output:
            **KEPT_OUTPUTS,  # validate.select_every_epochs: the kept epochs' weights
            weights=f"{RESULTS}/{{variant}}draft/trained/model.safetensors",
            history=f"{RESULTS}/{{variant}}draft/trained/history.json",
        log:
            f"{LOGS}/{{variant}}train_draft.log",
        conda:
            "../envs/pipeline.yaml"
        threads: 1  # torch threads on CPU: OpenMP ops slow many-fold when threads outnumber free cores
        resources:
            # DDP over that many processes; raise it in the workflow profile (set-resources: gpu, or
            # gres under gpus_as: gres)
            **gpu_request(1),
        params:
            **KEPT,
            draft=DRAFT_PARAMS,
            train=TRAIN_PARAMS,
            runtime=TRAIN_RUNTIME,
            work=f"{WORK}/{{variant}}train",  # the training state (resume); also the main-process port's key
        script:
            # a job file under work/ run by `accelerate launch`: DDP over the GPUs the job sees, one
            # CPU process without (eagle3_pipeline.launch)
            "../scripts/train_draft.py"


rule export_draft:
    input:
        weights=get_export_weights,
        vocab_map=rules.vocab_map.output,
        target=get_target_config(),
        hidden_states_metadata=get_export_metadata,
    output:
        config=f"{RESULTS}/{{variant}}draft/checkpoint/config.json",
        weights=f"{RESULTS}/{{variant}}draft/checkpoint/model.safetensors",
        # the same draft in speculators' format: `vllm serve` runs the folder with no flags
        speculators_config=f"{RESULTS}/{{variant}}draft/speculators/config.json",
        speculators_weights=f"{RESULTS}/{{variant}}draft/speculators/model.safetensors",
    log:
        f"{LOGS}/{{variant}}export_draft.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        **VERIFIER,  # the speculators folder's verifier, when target.hub_id is set
        # speculators_config's proposal
        speculative_tokens=SETTINGS.validate.num_speculative_tokens,
    script:
        "../scripts/export_draft.py"
