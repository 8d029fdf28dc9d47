"""Rule stop_server: after the last generation shard, stop the server the pipeline manages
(server.stop_after_generation) so that hidden-state extraction gets the GPUs."""

import json
from pathlib import Path

from eagle3_pipeline.logs import stage
from eagle3_pipeline.server.lifecycle import stop, write_stop_report

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
log = stage(snakemake)

server_json = json.loads(Path(snakemake.input.server).read_text())
server_cfg = snakemake.params.runtime.section("server", snakemake.params.server)
report = stop(server_json, server_cfg, Path(snakemake.params.state_dir))
log.info("stop_server: %s", report)
write_stop_report(report, snakemake.output[0])
