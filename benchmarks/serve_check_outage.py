"""The serve check's outage bound when the pipeline dies: on a real systemd (the distribution's own,
booted in namespaces of its own as the test tier does), production (the test tier's vLLM stand-in:
tests/support/standin_vllm.py's STOP_S, WORKER_LINGER_S and LOAD_S) is checked by a
pipeline in a child process, which is SIGKILLed a random time into the check; the figure is the time
from the kill until production answers /health again, with no later run of the pipeline.

Expected: at most lease_s + the check unit's stop + production's start (the lease counts from its last
renewal, every lease_s/4, so the outage lies between 3/4 of the lease and the whole of it, plus the
stop and the start). Prints one JSON object per lease and a summary. Needs root (it boots systemd).

    .venv/bin/python benchmarks/serve_check_outage.py --leases 10 30 --trials 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.systemd_box import UNIT, make_box, start_systemd_host, stop_systemd_host  # noqa: E402

CHILD = """
import json, sys, time
from eagle3_pipeline.server import host_record
from eagle3_pipeline.server.draft_command import draft_argv, vllm_exec
from eagle3_pipeline.server.host_record import serve_check_unit
from eagle3_pipeline.server.remote import RemoteHost
from eagle3_pipeline.settings import SshSettings, section
ssh, config, records, lease = json.loads(sys.argv[1])
host = RemoteHost('vllm-box', section(SshSettings, ssh), config)
cat = host.run('systemctl cat -- vllm.service').stdout
argv = draft_argv(vllm_exec(cat, 'vllm.service'), '/srv/d', 3, False)
with serve_check_unit(host, 'vllm.service', argv, record_dir=records, sudo=False, runtime_max_s=3600,
                      timeout_s=60, lease_s=lease):
    print('checking', flush=True); time.sleep(3600)
"""


def one_trial(host, box, lease_s: float) -> float:
    """Seconds from the pipeline's SIGKILL until production answers again."""
    import subprocess

    box.systemd.systemctl("start", UNIT)
    box.wait_production()
    args = [host.sshd.server_cfg()["ssh"], str(host.sshd.ssh_config), str(box.records), lease_s]
    command = [sys.executable, "-c", CHILD, json.dumps(args)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "checking"
    time.sleep(random.uniform(0, lease_s))  # the kill falls anywhere between two renewals
    child.kill()
    child.wait()
    killed = time.monotonic()
    box.systemd.wait_for(box.serving, lease_s + 120, "production back")
    outage = time.monotonic() - killed
    box.records.joinpath(f"{UNIT}.serve-check.json").unlink(missing_ok=True)  # the next run would tidy it
    for name in box.records.glob("*.env"):
        name.unlink()
    box.systemd.wait_for(lambda: box.check_units() == [], 60, "the check unit collected")
    assert box.gpu_refusals() == [], "two servers met on the GPU"
    return outage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", type=float, nargs="+", default=[10.0, 30.0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    host = start_systemd_host(Path(tempfile.mkdtemp(prefix="outage-sshd-")))
    try:
        sys.stdout.write(json.dumps({"systemd": host.systemd.version()}) + "\n")
        for lease in args.leases:
            box = make_box(host)
            try:
                outages = [one_trial(host, box, lease) for _ in range(args.trials)]
            finally:
                box.clean_up()
            figures = {
                "lease_s": lease, "trials": args.trials, "outage_s": [round(o, 1) for o in outages],
                "mean_s": round(statistics.mean(outages), 1), "max_s": round(max(outages), 1),
                "max_over_lease": round(max(outages) / lease, 2),
            }  # fmt: skip
            sys.stdout.write(json.dumps(figures) + "\n")
    finally:
        stop_systemd_host(host.systemd)


if __name__ == "__main__":
    main()
