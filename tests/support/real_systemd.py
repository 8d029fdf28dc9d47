"""The distribution's own systemd (Debian 12: 252), booted as PID 1 of its own namespaces, for the
serve check's real-systemd tier (tests/integration/test_serve_check_real_systemd.py).

How (no container runtime, nothing of the machine outside the namespaces changes): a cgroup folder
of our own on the machine's cgroup2 hierarchy becomes the root of a new cgroup namespace; `unshare
--pid --fork --mount --cgroup --uts --ipc --mount-proc` runs a small script that, in its private mount
namespace, mounts a fresh tmpfs on /run and /dev (a few device nodes, its own devpts), /proc/sys and
/sys read-only, cgroup2 from inside the new cgroup namespace on /sys/fs/cgroup, the tier's unit folder
over /etc/systemd/system, a minimal copy of the distribution's targets (and journald) over
/usr/lib/systemd/system, an empty folder over the generators, and then execs /lib/systemd/systemd with
`container=` in its environment. The tests reach it with `nsenter -t PID -a`, and over SSH through an
sshd that runs as a unit of that systemd (so `systemctl` in an SSH session talks to it). /tmp and the
rest of the file system are shared, so units run the programs the tests write. Teardown kills the
whole cgroup (cgroup.kill) and removes its folders.

A second, newer systemd: Debian's bookworm-backports builds 254 against the same libraries as 252,
so its packages (`fetch_release`: apt-get download from Debian's archive, unpacked with dpkg -x, no
install) run here as they are; inside the private mount namespace their files are bind-mounted over
the distribution's (PID 1, systemctl, systemd-run, journalctl, journald, the shared libraries and the
unit files), so the namespace's systemd, and every `systemctl` an SSH session runs there, is 254.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SYSTEMD = "/lib/systemd/system"
# a newer systemd from Debian's archive: (suite, version) -> the packages that make it
NEWER = {"254": ("bookworm-backports", "254.26-1~bpo12+1")}
PACKAGES = ("systemd", "libsystemd0", "libsystemd-shared")
# the distribution's files a release's own replace inside the namespace (its root holds the same paths)
OVERLAID = (
    "usr/lib/systemd", "usr/lib/x86_64-linux-gnu/systemd", "usr/bin/systemctl", "usr/bin/journalctl",
    "usr/bin/systemd-notify", "usr/bin/systemd-run",
)  # fmt: skip
# the units a minimal boot needs, copied from the distribution (its own files, its own version)
BOOT_UNITS = (
    "multi-user.target", "basic.target", "sysinit.target", "sockets.target", "timers.target",
    "paths.target", "slices.target", "local-fs.target", "local-fs-pre.target", "swap.target",
    "shutdown.target", "umount.target", "final.target", "emergency.target", "rescue.target",
    "network.target", "network-online.target", "nss-user-lookup.target", "systemd-journald.service",
    "systemd-journald.socket", "systemd-journald-dev-log.socket",
)  # fmt: skip
INNER = r"""
set -e
root=$1 release=$2
mount --make-rprivate /
if [ -n "$release" ]; then  # a newer systemd's files over the distribution's (module docstring)
  for path in $OVERLAID; do mount --bind "$release/$path" "$(readlink -f "/$path")"; done
  lib=usr/lib/x86_64-linux-gnu/libsystemd.so.0
  mount --bind "$(readlink -f "$release/$lib")" "$(readlink -f "/$lib")"
fi
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/lock /run/sshd
mount -t tmpfs -o mode=755,nosuid tmpfs /dev
for spec in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
  set -- $spec; mknod -m 666 "/dev/$1" c "$2" "$3"
done
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /dev/pts
ln -s pts/ptmx /dev/ptmx
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys
mount --bind /sys /sys && mount -o remount,bind,ro /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount --bind "$root/etc-units" /etc/systemd/system
mount --bind "$root/lib-units" /usr/lib/systemd/system
mount --bind "$root/empty" /usr/lib/systemd/system-generators
hostname eagle3-systemd-test
exec env -i container=eagle3-test PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  /usr/lib/systemd/systemd --show-status=no
"""


def cgroup2_root() -> Path | None:
    """Where this machine mounts the cgroup2 hierarchy (pure v2, or hybrid's `unified`), or None."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def why_not_here() -> str | None:
    """Why the tier cannot boot systemd on this machine; None when it can."""
    if os.geteuid() != 0:
        return "booting systemd in namespaces needs root"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian: util-linux)"
    if not Path("/lib/systemd/systemd").exists():
        return "needs the distribution's systemd (/lib/systemd/systemd; Debian: apt-get install systemd)"
    if cgroup2_root() is None:
        return "needs a cgroup2 hierarchy mounted on this machine"
    return None


@dataclass
class BootedSystemd:
    """A running systemd in its own namespaces: its PID (outside), its folders and version."""

    pid: int
    root: Path  # the tier's folder (world-readable: units run as other users read programs here)
    cgroup: Path
    proc: subprocess.Popen

    @property
    def units(self) -> Path:
        """Bind-mounted over /etc/systemd/system inside."""
        return self.root / "etc-units"

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A command inside every namespace of the booted systemd."""
        command = ["nsenter", "-t", str(self.pid), "-a", *argv]
        res = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr[-2000:]}")
        return res

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("systemctl", "--no-pager", *args, check=check)

    def show(self, unit: str, *names: str) -> dict[str, str]:
        out = self.systemctl("show", "-p", ",".join(names), "--", unit).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def version(self) -> str:
        return self.systemctl("--version").stdout.split("\n", 1)[0]

    def wait_for(self, predicate, timeout: float = 30, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not reached in {timeout} s")
            time.sleep(0.1)


def fetch_release(version: str, cache: Path) -> Path:
    """A newer systemd's packages from Debian's archive, unpacked under `cache` (once): its root."""
    suite, full = NEWER[version]
    root = cache / f"systemd-{full}"
    if (root / "usr" / "bin" / "systemctl").exists():
        return root
    work = cache / f"apt-{version}"
    (work / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (work / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (work / "sources.list").write_text(f"deb http://deb.debian.org/debian {suite} main\n")
    apt = [
        f"-oDir::Etc::SourceList={work}/sources.list", "-oDir::Etc::SourceParts=/dev/null",
        f"-oDir::State::Lists={work}/lists", f"-oDir::Cache={work}", "-oAPT::Sandbox::User=root", "-qq",
    ]  # fmt: skip
    subprocess.run(["apt-get", *apt, "update"], check=True, capture_output=True, timeout=300)
    subprocess.run(["apt-get", *apt, "download", *(f"{p}={full}" for p in PACKAGES)], check=True,
                   capture_output=True, timeout=300, cwd=work)  # fmt: skip
    unpacked = cache / f"unpacking-{full}"
    shutil.rmtree(unpacked, ignore_errors=True)
    for deb in sorted(work.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(unpacked)], check=True)
    for top in ("lib", "bin", "sbin"):  # the packages predate usrmerge: their paths as this system's
        if (unpacked / top).is_dir():
            subprocess.run(["cp", "-a", f"{unpacked / top}/.", str(unpacked / "usr" / top)], check=True)
            shutil.rmtree(unpacked / top)
    unpacked.rename(root)
    return root


def _lay_out(root: Path, release: Path | None) -> None:
    for folder in ("etc-units", "lib-units", "empty"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    lib = root / "lib-units"
    units = release / "usr" / "lib" / "systemd" / "system" if release else Path(SYSTEMD)
    for name in BOOT_UNITS:
        shutil.copy2(units / name, lib / name)
    (lib / "default.target").symlink_to("multi-user.target")
    for target, wanted in (
        ("sockets.target.wants", ("systemd-journald.socket", "systemd-journald-dev-log.socket")),
        ("sysinit.target.wants", ("systemd-journald.service",)),
    ):
        (lib / target).mkdir()
        for name in wanted:
            (lib / target / name).symlink_to(f"../{name}")
    root.chmod(0o755)


def boot(root: Path, release: Path | None = None, timeout: float = 60) -> BootedSystemd:
    """Boot systemd with `root` as its folder (the distribution's, or the one unpacked at `release`:
    fetch_release); returns once it reports running (or degraded)."""
    base = cgroup2_root()
    assert base is not None, why_not_here()
    _lay_out(root, release)
    cgroup = base / f"eagle3-systemd-{os.getpid()}-{root.name}"
    cgroup.mkdir()
    log = open(root / "boot.log", "wb")  # noqa: SIM115 (the process keeps it)
    proc = subprocess.Popen(
        ["bash", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec unshare --pid --fork --mount --cgroup '
         f'--uts --ipc --mount-proc bash -c "$0" inner "$1" "$2"', INNER, str(root), str(release or "")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "OVERLAID": " ".join(OVERLAID)},
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    pid = None  # unshare's child: PID 1 inside, which execs systemd
    while pid is None or _comm(pid) != "systemd":
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        found = children.read_text().split() if children.exists() else []
        pid = int(found[0]) if found else None
        if proc.poll() is not None or time.monotonic() > deadline:
            halt(cgroup)
            raise RuntimeError(f"systemd did not boot: {(root / 'boot.log').read_text()[-3000:]}")
        time.sleep(0.1)
    booted = BootedSystemd(pid, root, cgroup, proc)
    up = ("running", "degraded")
    while booted.run("systemctl", "is-system-running", check=False).stdout.strip() not in up:
        if time.monotonic() > deadline:
            halt(cgroup)
            raise RuntimeError(f"systemd did not come up: {(root / 'boot.log').read_text()[-3000:]}")
        time.sleep(0.2)
    return booted


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def halt(cgroup: Path) -> None:
    """Kill every process of the booted systemd's cgroup tree, then remove its folders."""
    if not cgroup.exists():
        return
    (cgroup / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            for folder in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                folder.rmdir()
            cgroup.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"could not remove {cgroup}: processes remain")
