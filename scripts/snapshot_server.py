"""Rule snapshot_server: read the vLLM unit (systemctl cat, or the unit file) and write
unit.service, server.json and identity.json, secrets redacted. A serve check left unfinished by a
killed run (its check unit running the draft instead of production) is recovered first, so that the
draft's command is never recorded as production's. A vLLM outside
the supported ranges is reported here, before any GPU work (vllm_releases.py): a warning for serving
and the export, an error for extraction when it will run the unit's vLLM."""

from eagle3_pipeline.hidden_states.vllm_backend import check_served_release
from eagle3_pipeline.logs import stage
from eagle3_pipeline.server.host_record import recover_leftover_check
from eagle3_pipeline.server.snapshot import snapshot_server
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import HiddenStatesSettings, ServerSettings

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

server = snakemake.params.runtime.whole(ServerSettings, "server", snakemake.params.server)
recover_leftover_check(server)
snapshot = snapshot_server(
    server,
    unit_out=snakemake.output.unit,
    server_out=snakemake.output.server,
    identity_out=snakemake.output.identity,
)
if "hidden_states" in snakemake.params.runtime.sections:  # the primary's: extraction runs its vLLM
    hidden_states = snakemake.params.runtime.whole(HiddenStatesSettings, "hidden_states")
    check_served_release(hidden_states, ServerSnapshot.from_json(snapshot))
