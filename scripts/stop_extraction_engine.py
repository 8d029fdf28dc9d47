"""Rule stop_extraction_engine: stop the extraction engine once every job it serves is done and write
what it did (start id, busy seconds, tokens) as the rule's report (hidden_states/engine.py)."""

from pathlib import Path

from eagle3_pipeline import io
from eagle3_pipeline.hidden_states.engine import stop_engine
from eagle3_pipeline.logs import stage

snakemake = globals()["snakemake"]  # injected by Snakemake's script: directive
stage(snakemake)

folder = Path(snakemake.output[0]).parent
report = stop_engine(folder)
io.write_json({"engine_dir": str(folder), **report}, snakemake.output[0])
