# Reconnaissance and lifecycle of the vLLM systemd service. The snapshot is a rule (never parse-time
# work); the server is started by the first generation shard that must run and stopped after the last.


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
        server=as_params(SETTINGS.server, "host", "unit", "unit_file", "base_url"),
        runtime=runtime_only(server=as_params(SETTINGS.server)),
    script:
        "../scripts/snapshot_server.py"


rule stop_server:
    input:
        server=rules.snapshot_server.output.server,
        generations=get_generation_shards,
    output:
        f"{RESULTS}/server/stopped.json",
    log:
        f"{LOGS}/stop_server.log",
    conda:
        "../envs/pipeline.yaml"
    params:
        # what decides whether it stops the unit: the report says what it did
        server=as_params(
            SETTINGS.server, "manage", "stop_after_generation", "stop_foreign"
        ),
        runtime=runtime_only(server=as_params(SETTINGS.server)),
        state_dir=f"{WORK}/server",
    script:
        "../scripts/stop_server.py"
