"""Rule stop_server: after the last generation shard, stop the server the pipeline manages
(server.stop_after_generation) so that hidden-state extraction gets the GPUs."""

from pathlib import Path

from eagle3_pipeline.logs import stage
from eagle3_pipeline.server.lifecycle import stop, write_stop_report
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.settings import ServerSettings

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
log = stage(snakemake)

snapshot = ServerSnapshot.load(snakemake.input.server)
server = snakemake.params.runtime.whole(ServerSettings, "server", snakemake.params.server)
report = stop(snapshot, server, Path(snakemake.params.state_dir))
log.info("stop_server: %s", report)
write_stop_report(report, snakemake.output[0])
