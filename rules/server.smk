# Reconnaissance and lifecycle of the vLLM systemd service. The snapshot is a rule (never parse-time
# work); the server is started by the first generation shard that must run and stopped after the last.
# server.replicas: more servers of the same model, each snapshotted under server/replicas/NAME/,
# checked identical to the primary, preflighted and stopped by its own jobs (server/replicas.py).
from eagle3_pipeline.server.replicas import (
    assigned_server,
    fleet,
    resource_name,
    shard_caps,
)

FLEET = fleet(config["server"], RESULTS, WORK)
REPLICAS = [server.name for server in FLEET.replicas]
# the primary's own config: `server` less the fleet keys (name, max_shard_jobs, replicas), so that the
# rules' params are what they were before replicas existed and adding one reruns nothing
SERVER = FLEET.servers[0].config
# server.max_shard_jobs caps as global resources (a --resources NAME=N given on the command line
# wins): Snakemake's scheduler counts them over every job it runs or submits, on any node
for _name, _cap in shard_caps(config["server"]).items():
    if _cap is not None and resource_name(_name) not in workflow.global_resources:
        workflow.global_resources[resource_name(_name)] = _cap


def get_replica(wildcards):
    return FLEET.servers[FLEET.names.index(wildcards.replica)]


def get_replica_config(wildcards):
    return get_replica(wildcards).config


def replica_params(*keys):
    """An input function: these keys of the replica's section, recorded as params (rerun triggers)."""

    def get(wildcards):
        replica = get_replica_config(wildcards)
        return {key: replica.get(key) for key in keys}

    return get


def get_replica_runtime(wildcards):
    """The replica's whole section as run-time values (not recorded: see runtime_only)."""
    return runtime_only(server=get_replica_config(wildcards))


def get_replica_server_json(wildcards):
    return get_replica(wildcards).server_json


def get_replica_state_dir(wildcards):
    return get_replica(wildcards).state_dir


def get_replica_unit_file_input(wildcards):
    """A local replica's unit file (as get_unit_file_input for the primary)."""
    replica = get_replica_config(wildcards)
    local = replica["host"] == "local" and replica.get("unit_file")
    return [replica["unit_file"]] if local else []


def get_replica_files(pattern):
    """An input function: `pattern` for every replica ([] without replicas: no new input)."""
    files = [pattern.format(replica=name) for name in REPLICAS]

    def get_files(wildcards):
        return files

    return get_files


def get_server_resources():
    """generate_shard's resources: vllm_NAME = 1 for the server shard k is sent to (k mod n), 0 for
    the others. Resources are no rerun trigger: moving a shard to another replica reruns nothing.
    """

    def one(name):
        def get(wildcards):
            return int(assigned_server(int(wildcards.shard), FLEET.names) == name)

        return get

    return {resource_name(name): one(name) for name in FLEET.names}


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
        runtime=runtime_only(server=SERVER),
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
        server=replica_params("host", "unit", "unit_file", "base_url"),
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
        server=replica_params("manage", "stop_after_generation", "stop_foreign"),
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
        server=as_params(
            SETTINGS.server, "manage", "stop_after_generation", "stop_foreign"
        ),
        runtime=runtime_only(server=SERVER),
        state_dir=f"{WORK}/server",
    script:
        "../scripts/stop_server.py"
