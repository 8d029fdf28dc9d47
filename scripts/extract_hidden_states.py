"""Hidden states of shard k of each split; run by `accelerate launch` from rule extract_hidden_states.

--traces, --output and --metadata take one path per split, in the same order; the target is loaded
once for all of them. Each split's resumable state is WORK/<the output's folder name>.
--backend vllm runs the target in a vLLM engine (an interpreter with vLLM, from --vllm or the
snapshot --server-json); transformers loads it here.
"""

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from eagle3_pipeline.hidden_states.extract import ExtractSettings, extract_shards
from eagle3_pipeline.logs import setup_logging


def parse_args(argv: list[str]) -> list[ExtractSettings]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--traces", type=Path, nargs="+", required=True, help="traces/{split}.parquet, per split")
    p.add_argument("--shard", type=int, required=True, help="rows whose `shard` column equals this")
    p.add_argument("--target", type=Path, required=True, help="target weights folder (transformers)")
    p.add_argument("--output", type=Path, nargs="+", required=True, help="{split}/shard-{k:05d}.safetensors")
    p.add_argument("--metadata", type=Path, nargs="+", required=True, help="{split}/shard-{k:05d}.json")
    p.add_argument("--work", type=Path, required=True, help="resumable state (per-batch parts), per split")
    p.add_argument("--layers", nargs="+", default=["auto"], help="auto, or three 0-indexed layer outputs")
    p.add_argument("--max-seq-len", type=int, default=16384)
    p.add_argument("--overlong", choices=["truncate", "drop"], default="truncate")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--compute-dtype", choices=["auto", "bfloat16", "float32"], default="auto")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--device-map", action="store_true", help="spread the model over all visible devices")
    p.add_argument("--trust-remote-code", action="store_true", help="the target ships its own model code")
    p.add_argument("--backend", choices=["vllm", "transformers"], default="transformers")
    p.add_argument("--vllm", type=json.loads, default={}, help="hidden_states.vllm as JSON (null: snapshot)")
    p.add_argument("--server-json", type=Path, default=None, help="the served unit's snapshot (vllm backend)")
    args = vars(p.parse_args(argv))
    splits = [args.pop(name) for name in ("traces", "output", "metadata")]
    if len({len(paths) for paths in splits}) != 1:
        p.error("--traces, --output and --metadata need one path per split each, in the same order")
    work = args.pop("work")
    shared = ExtractSettings(traces=Path(), output=Path(), metadata=Path(), work=work, **args)
    shared.device_map |= os.environ.get("EAGLE3_LAUNCH_MODE") == "device_map"  # eagle3_pipeline.launch
    return [
        dataclasses.replace(
            shared, traces=traces, output=output, metadata=metadata, work=work / output.parent.name
        )
        for traces, output, metadata in zip(*splits, strict=True)
    ]


if __name__ == "__main__":
    setup_logging(None, "extract_hidden_states")  # stderr is the job's log (the rule redirects it)
    extract_shards(parse_args(sys.argv[1:]))
