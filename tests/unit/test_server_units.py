"""The unit corpus: every file under tests/data/units/<case>/ snapshotted and compared with its
expected.json (server.json and identity.json). `@DIR@` in a case stands for the case's folder.

Regenerate after a deliberate change with REGEN_UNIT_EXPECTED=1, then review every diff by hand.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

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
        from eagle3_pipeline.server.secrets import redact_unit_text

        unit_text = redact_unit_text(text)
    else:
        unit_file = next(folder.glob("*.service"))
        cfg = ServerSettings(unit=unit_file.name, unit_file=str(unit_file))
        unit_text, server, identity = take_snapshot(cfg, host)
    back = json.loads(json.dumps([server, identity]).replace(str(folder), "@DIR@"))
    return unit_text.replace(str(folder), "@DIR@"), back[0], back[1]


@pytest.mark.parametrize("case", CASES)
def test_unit_corpus(case: str, tmp_path: Path) -> None:
    _, server, identity = snapshot_case(case, tmp_path)
    expected_path = CORPUS / case / "expected.json"
    got = {"server": server, "identity": identity}
    if os.environ.get("REGEN_UNIT_EXPECTED"):
        expected_path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    expected = json.loads(expected_path.read_text())
    assert got == expected


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES)
def test_snapshot_is_deterministic(case: str, tmp_path: Path) -> None:
    first = snapshot_case(case, tmp_path / "a")
    second = snapshot_case(case, tmp_path / "b")
    assert first == second
