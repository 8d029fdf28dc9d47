"""Hidden states of one trace shard; run by `accelerate launch` from rule extract_hidden_states."""

import argparse
import logging
import os
import sys
from pathlib import Path

from eagle3_pipeline.hidden_states.extract import ExtractSettings, extract_shard


def parse_args(argv: list[str]) -> ExtractSettings:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--traces", type=Path, required=True, help="traces/{split}.parquet")
    p.add_argument("--shard", type=int, required=True, help="rows whose `shard` column equals this")
    p.add_argument("--target", type=Path, required=True, help="target weights folder (transformers)")
    p.add_argument("--output", type=Path, required=True, help="shard-{k:05d}.safetensors")
    p.add_argument("--metadata", type=Path, required=True, help="shard-{k:05d}.json")
    p.add_argument("--work", type=Path, required=True, help="resumable state (per-batch parts)")
    p.add_argument("--layers", nargs="+", default=["auto"], help="auto, or three 0-indexed layer outputs")
    p.add_argument("--max-seq-len", type=int, default=16384)
    p.add_argument("--overlong", choices=["truncate", "drop"], default="truncate")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--compute-dtype", choices=["auto", "bfloat16", "float32"], default="auto")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--device-map", action="store_true", help="spread the model over all visible devices")
    p.add_argument("--trust-remote-code", action="store_true", help="the target ships its own model code")
    settings = ExtractSettings(**vars(p.parse_args(argv)))
    settings.device_map |= os.environ.get("EAGLE3_LAUNCH_MODE") == "device_map"  # eagle3_pipeline.launch
    return settings


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    extract_shard(parse_args(sys.argv[1:]))
