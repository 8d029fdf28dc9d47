"""A job that fails on the user's input ends with one line naming the config key or file to fix (issue 40,
item 6): the job's log and stderr end with `ERROR: <rule> failed: ... (fix: ...)` (logs.setup_logging,
fixes.error_line), printed before Snakemake's own trace, and the Snakefile's onerror prints it again as
the run's last words. Two real, cheap failing runs: a dataset in the wrong format, and an SSH host on
127.0.0.1 where nothing listens.
"""

from __future__ import annotations

from pathlib import Path

from support.workflow import REPO, workdir_run, write_config

from eagle3_pipeline.ports import free_port


def failed_run(workdir: Path, config: Path, until: str) -> str:
    (workdir / "config").symlink_to(REPO / "config")
    result = workdir_run(workdir, "--cores", "1", "--configfile", str(config), "--until", until, timeout=300)
    assert result.returncode != 0
    return result.stdout + result.stderr


def fix_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ERROR: ")]


def test_a_dataset_in_the_wrong_format_names_dataset_path(tmp_path):
    dataset = tmp_path / "mine.jsonl"
    dataset.write_text('{"text": "no conversations"}\n{"prompt": "nor messages"}\n')
    config = write_config(tmp_path / "mine.yaml", run="mine", dataset={"path": str(dataset)})
    text = failed_run(tmp_path, config, "prepare_prompts")
    lines = fix_lines(text)
    assert lines, text[-3000:]
    assert all("prepare_prompts failed: DatasetError" in line for line in lines)
    assert "(fix: dataset.path" in lines[-1] and "log: results/mine/logs/prepare_prompts/" in lines[-1]
    # before Snakemake's trace, and again after its report
    assert text.index(lines[0]) < text.index("RuleException")
    assert text.rindex("What to fix:") > text.rindex("Error in rule prepare_prompts")
    log = tmp_path / "results" / "mine" / "logs" / "prepare_prompts" / "00000.log"
    assert log.read_text().rstrip().splitlines()[-1] == lines[-1]


def test_an_ssh_host_that_does_not_answer_names_server_host(tmp_path):
    port = free_port()  # nothing listens there
    config = write_config(
        tmp_path / "ssh.yaml",
        run="ssh",
        server={"host": f"nobody@127.0.0.1:{port}", "unit_file": None, "ssh": {"connect_timeout_s": 5}},
    )
    text = failed_run(tmp_path, config, "snapshot_server")
    last = fix_lines(text)[-1]
    assert f"SSH to nobody@127.0.0.1:{port}" in last, text[-3000:]
    assert "(fix: server.host" in last and "server.ssh.*" in last and "known_hosts" in last
    assert text.rindex("What to fix:") > text.rindex("Error in rule snapshot_server")
