"""accelerate launch flags: one process per GPU given, clamped to the devices a job really sees."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from accelerate.commands.launch import launch_command_parser

from eagle3_pipeline.launch import (
    LaunchMode,
    accelerate_args,
    clamp_processes,
    describe,
    launch_argv,
    launch_flags,
    main_process_port,
    visible_gpu_count,
)


def _parsed(flags: str, script: str = "train.py"):
    """The flags as accelerate's own launch parser reads them."""
    return launch_command_parser().parse_args([*shlex.split(flags), script])


def test_one_process_per_gpu_and_multi_gpu_only_when_several():
    eight = _parsed(accelerate_args(8, "train_draft"))
    assert (eight.num_processes, eight.multi_gpu, eight.cpu) == (8, True, False)
    one = _parsed(accelerate_args(1, "train_draft"))
    assert (one.num_processes, one.multi_gpu, one.cpu) == (1, False, False)


def test_no_gpu_means_one_cpu_process():
    args = _parsed(accelerate_args(0, "x"))
    assert (args.num_processes, args.cpu, args.multi_gpu) == (1, True, False)


def test_main_process_port_is_stable_per_job_and_differs_across_jobs():
    assert main_process_port("extract/train/00001") == main_process_port("extract/train/00001")
    ports = {main_process_port(f"extract/train/{k:05d}") for k in range(50)}
    assert len(ports) > 40
    assert all(29500 <= port < 31500 for port in ports)
    assert _parsed(accelerate_args(2, "a")).main_process_port == main_process_port("a")


@pytest.mark.parametrize(("requested", "visible", "expected"), [(8, 8, 8), (8, 2, 2), (1, 0, 0), (2, 8, 2)])
def test_clamp_never_exceeds_visible_devices(requested, visible, expected):
    assert clamp_processes(requested, visible) == expected


def test_a_job_asking_for_more_gpus_than_visible_runs_with_what_is_there():
    assert _parsed(accelerate_args(8, "k", visible=2)).num_processes == 2
    cpu = _parsed(launch_flags(8, "k", visible=0))
    assert (cpu.cpu, cpu.num_processes) == (True, 1)
    assert "clamped from 8: only 2 visible" in describe(8, 2, LaunchMode.DDP)


def test_device_map_mode_runs_one_process_over_all_gpus():
    args = _parsed(launch_flags(8, "k", visible=8, mode=LaunchMode.DEVICE_MAP))
    assert (args.num_processes, args.multi_gpu, args.cpu) == (1, False, False)
    assert "sharding the model over 8 GPU(s)" in describe(8, 8, LaunchMode.DEVICE_MAP)


def test_the_client_mode_starts_no_accelerate_processes():
    assert "one client process" in describe(8, 8, LaunchMode.CLIENT)
    with pytest.raises(ValueError, match="starts no accelerate processes"):
        launch_flags(1, "k", 1, mode=LaunchMode.CLIENT)


@pytest.mark.parametrize(
    ("value", "count"), [("0,1,2,3", 4), ("", 0), ("NoDevFiles", 0), ("-1", 0), ("GPU-5a1b,GPU-77c2", 2)]
)
def test_visible_devices_come_from_cuda_visible_devices(value, count):
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": value}) == count


def test_without_cuda_visible_devices_torch_counts(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert visible_gpu_count({}) == 0


def test_launch_argv_puts_config_flags_then_script():
    argv = launch_argv(8, "k", ["scripts/x.py", "--a", "1"], visible=4, config_file="c.yaml")
    assert argv[:5] == [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "c.yaml"]
    assert argv[-3:] == ["scripts/x.py", "--a", "1"]
    assert argv[argv.index("--num_processes") + 1] == "4"
    with pytest.raises(ValueError, match="no script to launch"):
        launch_argv(1, "k", [], visible=1)


def test_cli_clamps_and_really_launches_through_accelerate(tmp_path):
    """The module entry point on this (GPU-less) machine: a job asking for 8 GPUs runs as one CPU process."""
    script = tmp_path / "probe.py"
    out = tmp_path / "out.txt"
    script.write_text(
        "import sys\n"
        "from accelerate import PartialState\n"
        "state = PartialState()\n"
        f"open({str(out)!r}, 'w').write(f'{{state.num_processes}} {{state.device.type}} ' + sys.argv[1])\n"
    )
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle3_pipeline.launch",
            "--gpus",
            "8",
            "--job-key",
            "t/1",
            "--",
            str(script),
            "hi",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "job asked for 8 GPU(s), 0 visible: starting 1 CPU process" in result.stderr
    assert out.read_text() == "1 cpu hi"
