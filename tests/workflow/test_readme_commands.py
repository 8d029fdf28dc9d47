"""Every command block of README.md runs as written (issue 40, item 1).

The ```bash / ```sh / ```console blocks are parsed and each command is run, in order, through bash in a
scratch copy of the repository (its own results/, .snakemake/ and config/): as written where it only
plans or reads, as a dry run where it would start real work (`snakemake` gets `-n`, `make demo`/`make test`
become `make -n ...`). A command that is neither is listed in ELSEWHERE with the test that exercises it;
a README command that is neither run here nor listed fails this test, and so does a command left in an
indented (unfenced) block, which this parser would not see. Dry runs only: about half a minute.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support.workflow import REPO, job_counts, scratch_checkout

README = REPO / "README.md"
COMMAND_LANGUAGES = ("bash", "sh", "console")
KIMI = "config/examples/kimi-k2.5-8gpu.yaml"

# Commands run elsewhere (real work, a person's host, or a plan another test already runs): the test
# that exercises each, and why not here.
ELSEWHERE: dict[str, tuple[str, str]] = {
    "snakemake --report results/demo/report.html": (
        "tests/workflow/test_report_rule.py",
        "needs a finished run; that test builds the report from a finished results tree",
    ),
    f"snakemake -n --configfile {KIMI}": (
        "tests/workflow/test_planning_without_weights.py",
        "the production dry run (16 s here), planned there without the weights, job by job",
    ),
    f"make plan CONFIG={KIMI}": ("tests/workflow/test_planning_without_weights.py", "make -n plan there"),
    f"snakemake -n --workflow-profile profiles/slurm --configfile {KIMI}": (
        "tests/workflow/test_profiles.py",
        "the SLURM profile's plan of the example without its weights there, through the plugin's code",
    ),
    f"python -m eagle3_pipeline.budget {KIMI}": (
        "tests/workflow/test_planning_without_weights.py",
        "the budget",
    ),
    f"make cost CONFIG={KIMI}": ("tests/workflow/test_planning_without_weights.py", "make cost"),
    "ssh-keyscan -p 22 HOSTNAME >> ~/.ssh/known_hosts": (
        "tests/integration/test_server_ssh.py",
        "a person's host; the SSH tier checks that an unknown host's error gives this line",
    ),
    "snakemake -n --configfile config/kimi.yaml": (
        "tests/workflow/test_planning_without_weights.py",
        "the example's plan from a copy; its job count is checked here on the --resources line",
    ),
    "snakemake --workflow-profile profiles/slurm --configfile config/kimi.yaml": (
        "tests/workflow/test_profiles.py",
        "the SLURM profile's plan of the example (its sbatch lines)",
    ),
}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)


def commands(language: str, body: str) -> list[str]:
    """A block's commands: continuations joined, comments and console prompts/output dropped."""
    lines = body.replace("\\\n", " ").splitlines()
    if language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    stripped = (re.sub(r"\s+#.*$", "", line).strip() for line in lines)
    return [re.sub(r"\s+", " ", line) for line in stripped if line and not line.startswith("#")]


def readme_commands() -> list[str]:
    return [
        command
        for language, body in fenced_blocks(README.read_text())
        if language in COMMAND_LANGUAGES
        for command in commands(language, body)
    ]


# the draft served by vLLM as README shows it: run as written (vLLM 0.32 CPU, the target in an offline hub
# cache) by tests/integration/test_readme_serve_commands.py, which needs a trained draft and vLLM
SERVE_COMMANDS = "tests/integration/test_readme_serve_commands.py"
ELSEWHERE |= {
    command: (SERVE_COMMANDS, "starts vLLM on an exported draft")
    for command in (
        "vllm serve results/RUN/draft/speculators",
        'vllm serve TARGET --speculative-config \'{"method": "eagle3", "model": '
        '"results/RUN/draft/speculators", "num_speculative_tokens": 3}\'',
        'vllm serve TARGET --speculative-config \'{"method": "eagle3", "model": '
        '"results/RUN/draft/checkpoint", "num_speculative_tokens": 3}\'',
    )
}


def as_run(command: str) -> str:
    """The command as this test runs it: a dry run where it would start real work."""
    if re.fullmatch(r"make (demo|test)( DEMO=\w+)?", command):  # DEMO=kimi: the Kimi-family demo
        return command.replace("make ", "make -n ", 1)
    if command.startswith("snakemake ") and " -n" not in command and "--report" not in command:
        return command.replace("snakemake ", "snakemake -n ", 1)
    return command


def shell(root: Path, command: str) -> subprocess.CompletedProcess[str]:
    """`command` as a person types it after `source .venv/bin/activate` (no inherited make level)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    return subprocess.run(
        ["bash", "-c", f"source .venv/bin/activate && {command}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scratch_checkout(tmp_path_factory.mktemp("readme"))


def test_the_readme_has_command_blocks_and_no_unfenced_commands():
    text = README.read_text()
    assert len(readme_commands()) >= 10
    outside = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    unfenced = re.findall(
        r"^ {4}(?:\$ )?(?:make|snakemake|python|source|cp|ssh-keyscan|pip|bash|vllm) .*", outside, re.M
    )
    assert not unfenced, (
        f"commands in an indented block: fence them as ```bash so that they are tested: {unfenced}"
    )


def test_every_listed_command_is_in_the_readme_and_its_test_exists():
    listed = set(readme_commands())
    for command, (test, _why) in ELSEWHERE.items():
        assert command in listed, f"ELSEWHERE lists a command README.md no longer has: {command}"
        assert (REPO / test).exists(), f"{command}: {test} does not exist"


def test_every_readme_command_runs_as_written(scratch):
    ran = []
    for command in readme_commands():
        if command in ELSEWHERE:
            continue
        run = as_run(command)
        result = shell(scratch, run)
        text = result.stdout + result.stderr
        if command.startswith("python -m eagle3_pipeline.budget"):
            # exit 1 means the numbers do not fit this machine's disk: the command worked
            assert result.returncode == 0 or "DOES NOT FIT" in text, f"{run}:\n{text[-3000:]}"
        else:
            assert result.returncode == 0, f"README.md's `{command}` failed as `{run}`:\n{text[-3000:]}"
        if "--set-resources" in command:  # the plan the README counts on the line before
            total = sum(job_counts(result.stdout).values())
            assert f"{total:,} jobs planned" in README.read_text(), (
                f"the plan has {total:,} jobs: update README's 'N jobs planned' (and the total in "
                "tests/workflow/test_planning_without_weights.py)"
            )
        ran.append(run)
    assert (
        "make -n demo" in ran
        and "make -n demo DEMO=kimi" in ran
        and "snakemake -n" in ran
        and "snakemake -n --cores all" in ran
    )
