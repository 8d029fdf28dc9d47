"""Launching GPU steps with `accelerate launch`, sized to the GPUs a job really has.

Snakemake gives a job `resources.gpu` (capped locally by `--resources gpu=N`, mapped to `--gpus=N` by
the SLURM plugin; `resources.gres` gpu:N under a profile that names GPUs as gres: job_gpus), but
assigns no device ids and cannot see what a node really exposes. So the flags are decided in the job,
at launch time: the process count is clamped to the devices visible in the job
(`CUDA_VISIBLE_DEVICES`, else torch), the decision is logged, and `accelerate launch` is exec'd with
this interpreter (`sys.executable`). A rule that asks for more GPUs than the node exposes still
runs correctly, and nothing machine-specific (interpreter, checkout path) is in any rule's params.

The GPU rules (train_draft, train_draft_window, extract_hidden_states) use the thin-script pattern: the
script writes a job file (`write_job`: inputs, outputs and the settings the job needs, under the job's
work folder) and calls `exec_job`, which becomes

    accelerate launch <flags> -m eagle3_pipeline.draft JOB.json          # or eagle3_pipeline.hidden_states

whose module reads the job file back (`read_job`). By hand, the same launcher takes a script:

    python -m eagle3_pipeline.launch --gpus 8 --job-key K [--mode ddp|device_map] \\
        [--config-file my_accelerate.yaml] -- -m eagle3_pipeline.draft JOB.json

Modes (`LaunchMode`): `ddp` runs one process per GPU (the draft, which fits on one GPU many times
over); `device_map` runs a single process that sees every GPU of the job, for a target too large for
one GPU (a 1T MoE is sharded over all 8 with `device_map="auto"`; DDP would need 8 copies of it);
`client` runs one plain process without accelerate, a client of a process that holds the GPUs itself.
The launched module reads how to place its model from its own job file, not from the launcher.
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import os
import re
import shlex
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from eagle3_pipeline import io
from eagle3_pipeline.logs import setup_logging

logger = logging.getLogger(__name__)


class LaunchMode(enum.Enum):
    DDP = "ddp"  # one process per GPU
    DEVICE_MAP = "device_map"  # one process that spreads the model over every GPU of the job
    CLIENT = "client"  # one plain process, no accelerate (the vllm backend's extraction engine's client)


MODES = (LaunchMode.DDP.value, LaunchMode.DEVICE_MAP.value)  # what `accelerate launch` can start


# a generic resource of GPUs, as a profile under gpus_as: gres names them (gpu:N or gpu:TYPE:N)
GRES_GPUS = re.compile(r"^gpu(?::[\w.]+)?:(\d+)$")


def job_gpus(resources: Mapping[str, Any]) -> int:
    """The GPUs Snakemake gave a job: its `gpu` resource, else the count of its `gres` of GPUs (a
    profile that names GPUs as gres: rules/common.smk's gpu_request), else 0."""
    if count := resources.get("gpu"):
        return int(count)
    match = GRES_GPUS.match(str(resources.get("gres") or ""))
    return int(match.group(1)) if match else 0


def main_process_port(job_key: str, base: int = 29500, span: int = 2000) -> int:
    """A port per job (stable for a job, different across jobs) so side-by-side launches don't collide."""
    return base + zlib.crc32(job_key.encode()) % span


def accelerate_args(gpus: int, job_key: str, visible: int | None = None) -> str:
    """`accelerate launch` flags: one process per GPU; a single CPU process when the job has none.

    Args:
        gpus: GPUs Snakemake gave the job (`resources.gpu`).
        job_key: Identifies the job (rule and wildcards); picks its main-process port.
        visible: Devices the job can see, when known (launch time); the process count is clamped to it.

    Precision is the script's choice (bf16 autocast on GPU, fp32 on CPU), not the launcher's.
    """
    processes = gpus if visible is None else clamp_processes(gpus, visible)
    if processes <= 0:
        return "--cpu --num_processes 1 --num_machines 1 --dynamo_backend no"
    multi = "--multi_gpu " if processes > 1 else ""
    return (
        f"{multi}--num_processes {processes} --num_machines 1 --dynamo_backend no "
        f"--main_process_port {main_process_port(job_key)}"
    )


def clamp_processes(requested: int, visible: int) -> int:
    """Processes to start: what the job asked for, but never more than the devices it can see."""
    return max(0, min(requested, visible))


def visible_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """CUDA devices this process may use: CUDA_VISIBLE_DEVICES when set, else what torch counts.

    Only called at launch time, inside the job: never at parse time (no GPU probe in a dry run).
    """
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [part for part in listed.replace(" ", "").split(",") if part]
        # "NoDevFiles" (SLURM without GPUs) and "-1" both mean: no device.
        return 0 if any(part in ("NoDevFiles", "-1") for part in ids[:1]) else len(ids)
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch_flags(gpus: int, job_key: str, visible: int, mode: LaunchMode = LaunchMode.DDP) -> str:
    """The `accelerate launch` flags for a job given `gpus` GPUs of which `visible` are really there."""
    if mode is LaunchMode.CLIENT:
        raise ValueError(f"{mode} starts no accelerate processes; use one of {MODES}")
    usable = clamp_processes(gpus, visible)
    if mode is LaunchMode.DEVICE_MAP and usable > 0:
        # One process; the script shards the model over every visible device (device_map="auto").
        return (
            "--num_processes 1 --num_machines 1 --dynamo_backend no "
            f"--main_process_port {main_process_port(job_key)}"
        )
    return accelerate_args(usable, job_key)


def launch_argv(
    gpus: int,
    job_key: str,
    script_argv: Sequence[str],
    visible: int,
    mode: LaunchMode = LaunchMode.DDP,
    config_file: str | None = None,
) -> list[str]:
    """The full command: this interpreter's `accelerate launch`, its flags, then the script and its args.

    Flags given here override the config file's (accelerate's own precedence).
    """
    if not script_argv:
        raise ValueError("no script to launch: put it after `--`, e.g. -- scripts/train.py --flag")
    argv = [sys.executable, "-m", "accelerate.commands.launch"]
    if config_file:
        argv += ["--config_file", config_file]
    argv += shlex.split(launch_flags(gpus, job_key, visible, mode))
    return argv + list(script_argv)


def describe(gpus: int, visible: int, mode: LaunchMode) -> str:
    """One log line saying what the job asked for, what it has, and what is started."""
    usable = clamp_processes(gpus, visible)
    if mode is LaunchMode.CLIENT:
        return f"one client process ({visible} GPU(s) visible, left to the engine it feeds)"
    if usable <= 0:
        what = "1 CPU process"
    elif mode is LaunchMode.DEVICE_MAP:
        what = f"1 process sharding the model over {usable} GPU(s)"
    else:
        what = f"{usable} process(es), one per GPU"
    note = f" (clamped from {gpus}: only {visible} visible)" if gpus > visible else ""
    return f"job asked for {gpus} GPU(s), {visible} visible: starting {what}{note}"


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_pipeline.launch",
        description="accelerate launch, with the process count clamped to the visible GPUs.",
    )
    parser.add_argument("--gpus", type=int, required=True, help="GPUs given to the job (resources.gpu)")
    parser.add_argument("--job-key", required=True, help="rule and wildcards; picks the main process port")
    parser.add_argument("--mode", choices=MODES, default="ddp", help="ddp or device_map (see module doc)")
    parser.add_argument("--config-file", default=None, help="an accelerate config; flags set here win")
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def write_job(job: Mapping[str, Any], path: str | Path) -> Path:
    """Write a job file: what a launched module reads instead of a command line (paths as strings)."""
    io.write_json(dict(job), path, indent=1, sort_keys=True, default=str)
    return Path(path)


def read_job(path: str | Path) -> dict[str, Any]:
    """A job file written by `write_job`.

    Raises:
        ValueError: the file is not a JSON object (the message names it).
    """
    job = json.loads(Path(path).read_text())
    if not isinstance(job, dict):
        raise ValueError(f"{path}: a job file holds a JSON object, not {type(job).__name__}")
    return job


def exec_job(
    module: str,
    job_file: str | Path,
    gpus: int,
    job_key: str,
    log_path: str | Path,
    mode: LaunchMode = LaunchMode.DDP,
) -> NoReturn:
    """Become `accelerate launch <flags> -m MODULE JOB_FILE`, its output appended to the job's log.

    The flags are decided here, at run time, from the GPUs the job was given and the devices it sees
    (see the module docstring); the interpreter is this one (`sys.executable`). Called by a rule's
    thin script after it wrote the job file, so nothing about the machine is in the rule's params.

    Args:
        module: The package module that runs the job (`python -m MODULE JOB_FILE`).
        job_file: Its job file (`write_job`).
        gpus: GPUs Snakemake gave the job (`resources.gpu`).
        job_key: Identifies the job (its work folder); picks the main-process port.
        log_path: The job's log; the launched processes' stdout and stderr are appended to it.
        mode: see LaunchMode.
    """
    argv = ["-m", module, str(job_file)]
    if mode is LaunchMode.CLIENT:
        _exec(gpus, mode, lambda visible: [sys.executable, *argv], log_path)
    _exec(gpus, mode, lambda visible: launch_argv(gpus, job_key, argv, visible, mode), log_path)


def _exec(
    gpus: int, mode: LaunchMode, command_for: Callable[[int], list[str]], log_path: str | Path | None = None
) -> NoReturn:
    """Log what is started on the devices visible now, then exec the command (stdout/stderr to log_path)."""
    visible = visible_gpu_count()
    command = command_for(visible)
    (logger.warning if gpus > visible else logger.info)(describe(gpus, visible, mode))
    logger.info("exec: %s", shlex.join(command))
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    if log_path is not None:  # the launched processes write where the rule's log is
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.execv(command[0], command)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: decide the flags from the visible devices, log them, exec `accelerate launch`."""
    setup_logging(None, "launch")  # stderr is the job's log
    args, script_argv = _parse(sys.argv[1:] if argv is None else argv)
    key, config_file, mode = args.job_key, args.config_file, LaunchMode(args.mode)
    _exec(args.gpus, mode, lambda seen: launch_argv(args.gpus, key, script_argv, seen, mode, config_file))


if __name__ == "__main__":
    main()
