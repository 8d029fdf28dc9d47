from eagle3_pipeline.server.replicas import (
    assigned_server,
    fleet,
    resource_name,
    shard_caps,
)
from eagle3_pipeline.settings import as_params, rerun_params, runtime_only

# server.replicas (server/replicas.py): more servers of the same model, shard k on server k mod n.

FLEET = fleet(SETTINGS.server, RESULTS, WORK)
REPLICAS = [server.name for server in FLEET.replicas]
# the primary's own section (less its replicas) as plain values: run-time only (runtime_only), so
# adding a replica reruns nothing
SERVER = as_params(FLEET.primary.settings)
# server.max_shard_jobs caps as global resources (a --resources NAME=N given on the command line
# wins): Snakemake's scheduler counts them over every job it runs or submits, on any node
for _name, _cap in shard_caps(SETTINGS.server).items():
    if _cap is not None and resource_name(_name) not in workflow.global_resources:
        workflow.global_resources[resource_name(_name)] = _cap


def get_replica(wildcards):
    return FLEET.servers[FLEET.names.index(wildcards.replica)]


def replica_params(job):
    """An input function: the replica's section's keys that rule `job` records for the primary (rerun
    triggers)."""

    def get(wildcards):
        return rerun_params(get_replica(wildcards).settings, job)

    return get


def get_replica_runtime(wildcards):
    """The replica's whole section as run-time values (not recorded: see runtime_only)."""
    return runtime_only(server=as_params(get_replica(wildcards).settings))


def get_replica_state_dir(wildcards):
    return get_replica(wildcards).state_dir


def get_replica_unit_file_input(wildcards):
    """A local replica's unit file (as get_unit_file_input for the primary)."""
    unit_file = get_replica(wildcards).settings.local_unit_file
    return [unit_file] if unit_file else []


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
