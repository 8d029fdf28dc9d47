"""Flags for `accelerate launch` from the resources Snakemake gave a job."""

from __future__ import annotations

import zlib


def main_process_port(job_key: str, base: int = 29500, span: int = 2000) -> int:
    """A port per job (stable for a job, different across jobs) so side-by-side launches don't collide."""
    return base + zlib.crc32(job_key.encode()) % span


def accelerate_args(gpus: int, job_key: str) -> str:
    """One process per GPU; a single CPU process when the job has none (the demo, CI).

    Precision is the script's choice (bf16 autocast on GPU, fp32 on CPU), not the launcher's.
    """
    if gpus <= 0:
        return "--cpu --num_processes 1 --num_machines 1 --dynamo_backend no"
    multi = "--multi_gpu " if gpus > 1 else ""
    return (
        f"{multi}--num_processes {gpus} --num_machines 1 --dynamo_backend no "
        f"--main_process_port {main_process_port(job_key)}"
    )
