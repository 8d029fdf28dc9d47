"""The unit corpus under tests/data/units/<case>/ (a unit file, or `systemctl cat` output in cat.txt, and
the expected.json it snapshots to): read by tests/unit/test_server_units.py, which only compares.

After a deliberate change, regenerate the expectations on purpose (never from a test run), then review
every diff by hand:

    cd tests && ../.venv/bin/python -m support.unit_corpus
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from eagle3_pipeline.secrets import redact_unit_text
from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.snapshot import build_server_json, parse_service, take_snapshot
from eagle3_pipeline.settings import ServerSettings

CORPUS = Path(__file__).parents[1] / "data" / "units"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())


def _materialise(case: str, tmp_path: Path) -> Path:
    """Copy a case to tmp_path with @DIR@ replaced by that folder."""
    dest = tmp_path / case
    shutil.copytree(CORPUS / case, dest)
    for path in dest.rglob("*"):
        if path.is_file() and path.name != "expected.json":
            path.write_text(path.read_text().replace("@DIR@", str(dest)))
    return dest


def snapshot_case(case: str, tmp_path: Path) -> tuple[str, dict, dict]:
    """(redacted unit text, server.json, identity.json) of a corpus case, @DIR@ put back."""
    folder = _materialise(case, tmp_path)
    host = LocalHost()
    cat = folder / "cat.txt"
    if cat.exists():
        text = cat.read_text()
        name = Path(text.splitlines()[0].removeprefix("# ")).name
        unit, env, _, command = parse_service(text, name, host)
        server, identity = build_server_json(unit, env, command, host, ServerSettings())
        unit_text = redact_unit_text(text)
    else:
        unit_file = next(folder.glob("*.service"))
        cfg = ServerSettings(unit=unit_file.name, unit_file=str(unit_file))
        unit_text, server, identity = take_snapshot(cfg, host)
    back = json.loads(json.dumps([server, identity]).replace(str(folder), "@DIR@"))
    return unit_text.replace(str(folder), "@DIR@"), back[0], back[1]


def expected_of(case: str, tmp_path: Path) -> dict:
    """What a case's expected.json holds: its server.json and identity.json."""
    _, server, identity = snapshot_case(case, tmp_path)
    return {"server": server, "identity": identity}


def regenerate() -> None:
    """Rewrite every case's expected.json from the current code."""
    with tempfile.TemporaryDirectory() as scratch:
        for case in CASES:
            got = expected_of(case, Path(scratch) / "run")
            (CORPUS / case / "expected.json").write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
            shutil.rmtree(Path(scratch) / "run")


if __name__ == "__main__":
    regenerate()
