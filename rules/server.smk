# Reconnaissance and lifecycle of the vLLM systemd service. The snapshot is a rule (never parse-time
# work); the server is started by the first generation shard that must run and stopped after the last.
# server.replicas: more servers of the same model, each snapshotted under server/replicas/NAME/,
# checked identical to the primary, preflighted and stopped by its own jobs (server/replicas.py).


rule snapshot_server:
    input:
        get_unit_file_input(),
    output:
        unit=f"{RESULTS}/server/unit.service",
        server=f"{RESULTS}/server/server.json",
        identity=f"{RESULTS}/server/identity.json",
    log:
        f"{LOGS}/snapshot_server.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        # which unit, where, and its URL: what the snapshot records
        server=rerun_params(SETTINGS.server, "snapshot_server"),
        # hidden_states: whether extraction runs the unit's vLLM, checked against its range here
        runtime=runtime_only(
            server=SERVER, hidden_states=as_params(SETTINGS.hidden_states)
        ),
    script:
        "../scripts/snapshot_server.py"


rule snapshot_replica:
    input:
        get_replica_unit_file_input,
    output:
        unit=f"{RESULTS}/server/replicas/{{replica}}/unit.service",
        server=f"{RESULTS}/server/replicas/{{replica}}/server.json",
        identity=f"{RESULTS}/server/replicas/{{replica}}/identity.json",
    log:
        f"{LOGS}/snapshot_replica/{{replica}}.log",
    wildcard_constraints:
        replica="|".join(REPLICAS) or "(?!)",
    conda:
        "../envs/pipeline.yaml"
    params:
        server=replica_params("snapshot_server"),
        runtime=get_replica_runtime,
    script:
        "../scripts/snapshot_server.py"


rule check_replica:
    input:
        primary_identity=rules.snapshot_server.output.identity,
        primary_server=rules.snapshot_server.output.server,
        identity=rules.snapshot_replica.output.identity,
        server=rules.snapshot_replica.output.server,
    output:
        f"{RESULTS}/server/replicas/{{replica}}/same_as_primary.json",
    log:
        f"{LOGS}/check_replica/{{replica}}.log",
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/check_replica.py"


rule check_replicas:
    input:
        get_replica_files(f"{RESULTS}/server/replicas/{{replica}}/same_as_primary.json"),
    output:
        # one name whatever the replicas (an empty list with none): the preflights wait on it, so no
        # server is started before every replica is known to serve the primary's model
        f"{RESULTS}/server/replicas/checked.json",
    log:
        f"{LOGS}/check_replicas.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        names=REPLICAS,
    script:
        "../scripts/check_replicas.py"


rule stop_replica:
    input:
        server=rules.snapshot_replica.output.server,
        generations=get_generation_shards,
    output:
        f"{RESULTS}/server/replicas/{{replica}}/stopped.json",
    log:
        f"{LOGS}/stop_replica/{{replica}}.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        server=replica_params("stop_server"),
        runtime=get_replica_runtime,
        state_dir=get_replica_state_dir,
    script:
        "../scripts/stop_server.py"


rule stop_server:
    input:
        server=rules.snapshot_server.output.server,
        generations=get_generation_shards,
        replicas=get_replica_files(
            f"{RESULTS}/server/replicas/{{replica}}/stopped.json"
        ),
    output:
        f"{RESULTS}/server/stopped.json",
    log:
        f"{LOGS}/stop_server.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        # what decides whether it stops the unit: the report says what it did
        server=rerun_params(SETTINGS.server, "stop_server"),
        runtime=runtime_only(server=SERVER),
        state_dir=f"{WORK}/server",
    script:
        "../scripts/stop_server.py"
