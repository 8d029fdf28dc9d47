# The EAGLE-3 draft: a draft vocabulary from loss-masked token counts, training-time-test training
# launched by accelerate (state under work/ for resume), and export to the EAGLE/SpecForge format.
import sys


rule vocab_map:
    input:
        metadata=shard_files(f"{RESULTS}/hidden_states/train/shard-{{shard}}.json"),
        target=get_target_config(),
    output:
        f"{RESULTS}/draft/vocab_map.safetensors",
    log:
        f"{LOGS}/vocab_map.log",
    params:
        draft_vocab_size=config["draft"]["draft_vocab_size"],
    script:
        "../scripts/vocab_map.py"


rule train_draft:
    input:
        states=get_hidden_state_shards,
        vocab_map=rules.vocab_map.output,
        target=get_target_config(),
    output:
        weights=f"{RESULTS}/draft/trained/model.safetensors",
        history=f"{RESULTS}/draft/trained/history.json",
    log:
        f"{LOGS}/train_draft.log",
    threads: 1  # torch threads on CPU: OpenMP ops slow many-fold when threads outnumber free cores
    resources:
        gpu=1,  # DDP over resources.gpu processes; raise it in the workflow profile (set-resources)
    params:
        # absolute: `snakemake --directory elsewhere` and a PATH without the venv both work
        python=sys.executable,
        script=f"{workflow.basedir}/scripts/train_draft.py",
        draft=config["draft"],
        shape=get_draft_shape_args(),
        train=config["train"],
        work=f"{WORK}/train",
    shell:
        # eagle3_pipeline.launch: `accelerate launch` with DDP over the GPUs the job sees (CPU when
        # none) and a main-process port per job (keyed on the work dir: baseline and main differ)
        "{params.python} -m eagle3_pipeline.launch --gpus {resources.gpu} --job-key {params.work}"
        " -- {params.script}"
        " --states {input.states} --vocab-map {input.vocab_map} --target $(dirname {input.target})"
        " --threads {threads} --work {params.work} --weights {output.weights} --history {output.history}"
        " --ttt-steps {params.draft[ttt_steps]} --step-weight-decay {params.draft[step_weight_decay]}"
        " {params.shape}"
        " --epochs {params.train[epochs]} --lr {params.train[lr]} --warmup-ratio {params.train[warmup_ratio]}"
        " --weight-decay {params.train[weight_decay]} --grad-clip {params.train[grad_clip]}"
        " --batch-tokens {params.train[batch_tokens]} --seed {params.train[seed]}"
        " --save-every-steps {params.train[save_every_steps]} > {log} 2>&1"


rule export_draft:
    input:
        weights=rules.train_draft.output.weights,
        vocab_map=rules.vocab_map.output,
        target=get_target_config(),
        hidden_states_metadata=f"{RESULTS}/hidden_states/train/shard-{SHARDS[0]}.json",
    output:
        config=f"{RESULTS}/draft/checkpoint/config.json",
        weights=f"{RESULTS}/draft/checkpoint/model.safetensors",
    log:
        f"{LOGS}/export_draft.log",
    script:
        "../scripts/export_draft.py"
