"""Rule snapshot_server: read the vLLM unit (systemctl cat, or the unit file) and write
unit.service, server.json and identity.json, secrets redacted. A serve-check drop-in left by a killed
run is restored first, so that the draft's command is never recorded as production's."""

from eagle3_pipeline.logs import stage
from eagle3_pipeline.server.host_record import recover_leftover_dropin
from eagle3_pipeline.server.snapshot import snapshot_server
from eagle3_pipeline.settings import ServerSettings

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

server = snakemake.params.runtime.whole(ServerSettings, "server", snakemake.params.server)
recover_leftover_dropin(server)
snapshot_server(
    server,
    unit_out=snakemake.output.unit,
    server_out=snakemake.output.server,
    identity_out=snakemake.output.identity,
)
