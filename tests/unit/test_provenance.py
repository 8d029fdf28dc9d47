"""Provenance records: package versions, the checkout's revision, the server's identity."""

import json
import platform
import subprocess
from importlib import metadata

import polars
import pytest

from eagle3_pipeline import provenance


def git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    folder = tmp_path / "checkout"
    folder.mkdir()
    git(folder, "init", "-q")
    (folder / "a.txt").write_text("a\n")
    git(folder, "add", "a.txt")
    git(folder, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    return folder


def test_versions_are_the_installed_ones():
    versions = provenance.package_versions()
    assert list(versions) == ["torch", "transformers", "vllm", "snakemake", "polars", "eagle3-pipeline"]
    assert versions["polars"] == polars.__version__
    assert versions["torch"] == metadata.version("torch")
    assert provenance.package_versions({"nothing": ("no-such-distribution-x",)}) == {"nothing": None}


def test_git_revision_clean_dirty_and_not_a_checkout(checkout, tmp_path):
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert provenance.git_revision(checkout) == {"commit": head.stdout.strip(), "dirty": False}
    (checkout / "untracked.txt").write_text("results are untracked\n")
    assert provenance.git_revision(checkout)["dirty"] is False
    (checkout / "a.txt").write_text("changed\n")
    assert provenance.git_revision(checkout)["dirty"] is True
    assert provenance.git_revision(tmp_path / "elsewhere") is None  # no such folder
    (checkout / "sub").mkdir()
    assert provenance.git_revision(checkout / "sub") is None  # inside a checkout, not the top of one


def test_record_written_beside_the_log_with_the_server_identity(tmp_path):
    server = {"identity": "abc123", "model": "/m", "base_url": "http://127.0.0.1:1", "vllm_version": "0.32.0"}
    (tmp_path / "server.json").write_text(json.dumps({**server, "args": {"--port": "1"}}))
    found = provenance.find_server_json(["x.parquet", [str(tmp_path / "server.json")], {"a": 1}, 3])
    assert found == str(tmp_path / "server.json")
    log = tmp_path / "logs" / "generate_shard" / "00001.log"
    path = provenance.write(log, "generate_shard", {"shard": "00001"}, found)
    assert path == tmp_path / "logs" / "generate_shard" / "00001.log.provenance.json"
    record = json.loads(path.read_text())
    assert record["rule"] == "generate_shard" and record["wildcards"] == {"shard": "00001"}
    assert record["server"] == server
    assert record["python"]["version"] == platform.python_version()
    assert record["packages"]["polars"] == polars.__version__
    assert record["git"] == provenance.git_revision()  # this checkout's, or None for an installed copy
    assert provenance.record("x")["server"] is None
