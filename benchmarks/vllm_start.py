"""The demo unit's vLLM server: start time and reply time with the unit's environment against vLLM's
defaults for the two settings the unit adds (VLLM_ENABLE_V1_MULTIPROCESSING=0, OMP_NUM_THREADS=1).

Each round starts the unit's own ExecStart (config/demo/vllm-demo.service.in rendered for a built
target, on a free port) once per case, in alternating order: seconds from the process start to
/health answering, then seconds for 3 greedy replies of 64 tokens. One JSON line per round and case,
then the medians side by side with their ratios.

    .venv/bin/python benchmarks/vllm_start.py [--target resources/demo/target] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

from eagle3_pipeline.demo.target import SERVED_MODEL_NAME, render_unit
from eagle3_pipeline.ports import free_port
from eagle3_pipeline.server.health import wait_healthy
from eagle3_pipeline.server.local_process import launch_local
from eagle3_pipeline.server.unit import command_argv, merge_unit

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "config" / "demo" / "vllm-demo.service.in"
UNIT_ONLY = ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")
QUESTIONS = ["What is 12 times 7?", "Name a prime number above 50.", "Write a haiku about rain."]


def unit_command(target: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The unit's ExecStart argv and Environment, parsed by the pipeline's own unit parser."""
    unit = merge_unit([("vllm-demo.service", render_unit(TEMPLATE.read_text(), REPO, target, port))], "x")
    return command_argv(unit.exec_start[-1], unit.environment, []), dict(unit.environment)


def one_start(target: Path, case: str, state_dir: Path) -> dict:
    """Started and waited for as the serve check does (local_process.launch_local: the unit's environment
    on a minimal systemd-like one; /health polled every second)."""
    port = free_port()
    argv, env = unit_command(target, port)
    if case == "vllm defaults":
        env = {k: v for k, v in env.items() if k not in UNIT_ONLY}
    url = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    handle = launch_local(argv, env, None, state_dir, case.replace(" ", "-"))
    try:
        wait_healthy(url, 600, handle.log_tail, handle.alive)
        healthy = time.perf_counter() - start
        start = time.perf_counter()
        for question in QUESTIONS:
            reply = requests.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": SERVED_MODEL_NAME,
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": 64,
                    "temperature": 0.0,
                },
                timeout=300,
            )
            reply.raise_for_status()
        replies = time.perf_counter() - start
        return {"case": case, "health_s": round(healthy, 1), "replies_s": round(replies, 2)}
    finally:
        handle.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=REPO / "resources" / "demo" / "target")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not (args.target / "model.safetensors").exists():
        sys.exit(f"no built target at {args.target}: snakemake --cores 2 resources/demo/vllm-demo.service")
    results: dict[str, list[dict]] = {"unit": [], "vllm defaults": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = ["unit", "vllm defaults"] if round_ % 2 == 0 else ["vllm defaults", "unit"]
            for case in order:
                record = one_start(args.target.resolve(), case, Path(tmp) / str(round_))
                results[case].append(record)
                sys.stdout.write(json.dumps({"round": round_, **record}) + "\n")
                sys.stdout.flush()
    keys = ("health_s", "replies_s")
    median = {
        case: {key: round(statistics.median(r[key] for r in records), 2) for key in keys}
        for case, records in results.items()
    }
    ratio = {key: round(median["vllm defaults"][key] / median["unit"][key], 2) for key in keys}
    sys.stdout.write(json.dumps({"median": median, "defaults_over_unit": ratio}) + "\n")


if __name__ == "__main__":
    main()
