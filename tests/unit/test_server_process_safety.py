"""Production safety without a host: SIGHUP ends the serve check through its restore, a stale pid
file never signals an unrelated process, and vLLM's version is read from package metadata, never by
running an interpreter the unit names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_pipeline.server.interrupts import Interrupted, interrupts_as_exceptions
from eagle3_pipeline.server.lifecycle import stop
from eagle3_pipeline.server.local_process import find_local, launch_local
from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.snapshot import _launcher_python, detect_vllm_version
from eagle3_pipeline.settings import ServerSettings


def test_sighup_becomes_an_exception_like_sigterm():
    """Item 5: a closed terminal (SIGHUP) unwinds through the restore, and the handler that was there
    before (SIG_DFL, or SIG_IGN under nohup) is put back."""
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(Interrupted) as info, interrupts_as_exceptions():
        os.kill(os.getpid(), signal.SIGHUP)
        signal.pause()
    assert info.value.signum == signal.SIGHUP
    assert signal.getsignal(signal.SIGHUP) is before


def _unrelated() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


@pytest.mark.skipif(
    Path("/run/systemd/system").is_dir(), reason="local process mode is for hosts without systemd"
)
def test_a_stale_pid_file_never_stops_an_unrelated_process(tmp_path: Path):
    """Item 1: the pid file of a server long gone names a pid the kernel gave to another program."""
    unit_file = tmp_path / "vllm.service"
    unit_file.write_text("[Service]\nExecStart=/bin/true\n")
    cfg = ServerSettings(
        unit="vllm.service", unit_file=str(unit_file), manage=True, stop_after_generation=True
    )
    other = _unrelated()
    try:
        for text in (f"{other.pid}\n", f"{other.pid} 12345\n"):  # an old pid file; another start time
            (tmp_path / "vllm.service.pid").write_text(text)
            assert find_local(tmp_path, "vllm.service") is None
            assert stop({"served_model_name": "m"}, cfg, tmp_path)["action"] == "none"
            assert other.poll() is None  # still running
    finally:
        other.kill()
        other.wait()
    ours = launch_local([sys.executable, "-c", "import time; time.sleep(60)"], {}, None, tmp_path, "ours")
    assert find_local(tmp_path, "ours") is not None  # the pid file names it with its start time
    ours.stop(5)


def test_the_vllm_version_is_read_as_data_never_run(tmp_path: Path):
    """Item 11: the interpreter (writable by the service account) is never executed by the snapshot."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    marker = tmp_path / "executed"
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\necho 6.6.6\n")
    python.chmod(0o755)
    meta = venv / "lib" / "python3.12" / "site-packages" / "vllm-0.10.1.1.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.10.1.1\n\nvLLM\n")
    assert detect_vllm_version(str(python), LocalHost()) == "0.10.1.1"
    assert not marker.exists()
    assert detect_vllm_version(str(tmp_path / "none" / "bin" / "python"), LocalHost()) is None


@pytest.mark.parametrize(
    ("launcher", "python"),
    [
        (["/usr/bin/numactl", "-m", "0", "/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
         "/opt/v/bin/python"),
        (["/opt/v/bin/python3", "-u", "-m", "vllm.entrypoints.openai.api_server"], "/opt/v/bin/python3"),
        (["/bin/bash", "-lc", "source", "/opt/venv/bin/activate", "&&", "exec", "vllm", "serve"],
         "/opt/venv/bin/python"),
    ],
)  # fmt: skip
def test_the_interpreter_behind_prefixes_and_options(launcher, python):
    """Item 13: `numactl -m 0 python -m vllm` (not numactl), `python3 -u -m vllm` (not -u), and a
    login shell that activates a virtualenv."""
    assert _launcher_python(launcher, LocalHost()) == python
