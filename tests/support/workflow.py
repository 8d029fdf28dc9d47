"""The suite's one way to run the real workflow: temporary configs, `snakemake` (dry runs and real runs
from a scratch working directory), its job table, and a scratch directory seeded with the shared demo
target so that no workflow test fits its own.

Used by tests/workflow/, tests/integration/ and benchmarks/planning.py. A dry run needs the dataset file
and the repository, no server, no SSH and no model weights. Nothing plans in the checkout itself: a dry
run (`snakemake`, `dry_run`, `planned_jobs`) given no directory of its own plans from a fresh scratch
working directory (`planning_workdir`), so that what `make demo` left in the checkout's results/,
resources/ and .snakemake/ changes no plan, and a plan writes nothing there (rule
serve_extraction_engine's service file is made when Snakemake plans). The demo end to end runs once per
session (`demo_e2e_workdir`): the tests that read it share it, a test that changes it works on a copy
(`copy_workdir`), which Snakemake sees as up to date.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "config" / "config.yaml"
KIMI_CONFIG = REPO / "config" / "examples" / "kimi-k2.5-8gpu.yaml"

# The shape of Kimi-K2.5's config.json that the pipeline reads (a DeepseekV3 text model in a VL wrapper).
KIMI_TARGET_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "vocab_size": 163840,
    },
}


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in, section by section (a new dict)."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def write_config(path: Path, base: Path = DEMO_CONFIG, **sections: Any) -> Path:
    """A copy of `base` with some sections overridden, written to `path`."""
    config = merge(yaml.safe_load(base.read_text()), sections)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(
    *args: str, cwd: Path | None = None, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real snakemake CLI (this interpreter's): in `cwd` (a checkout of its own, whose Snakefile
    it reads) or, by default, the repository's workflow from a fresh scratch working directory."""
    if cwd is None:
        with planning_workdir() as workdir:
            return workdir_run(workdir, *args, timeout=timeout, env=env)
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def workdir_run(
    workdir: Path, *args: str, timeout: float = 3600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The repository's workflow run from a scratch `workdir` (`--directory`): its results/ land there."""
    command = ["--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *args]
    return snakemake(*command, cwd=workdir, timeout=timeout, env=env)


@contextmanager
def planning_workdir() -> Iterator[Path]:
    """A fresh scratch working directory to plan from (config/ linked in, nothing else), removed after:
    the checkout's results/, resources/ and .snakemake/ are neither read nor written."""
    with tempfile.TemporaryDirectory(prefix="eagle3-plan-") as folder:
        (Path(folder) / "config").symlink_to(REPO / "config")
        yield Path(folder)


def failure(result: subprocess.CompletedProcess[str], logs: Path) -> str:
    """A failed run's message: snakemake's output and the tail of every job log under `logs`."""
    tails = "\n".join(f"== {p}\n{p.read_text()[-2000:]}" for p in sorted(logs.rglob("*.log")))
    return (
        f"snakemake failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}\n{tails}"
    )


# the repository as a checkout holds it, less tests and docs; the package is the venv's (editable)
CHECKOUT_FILES = ("Snakefile", "rules", "scripts", "envs", "profiles", "config", "report", "Makefile",
                  "pyproject.toml")  # fmt: skip


def scratch_checkout(root: Path) -> Path:
    """A copy of the checkout's workflow files in `root`, whose `.venv` is this test's interpreter's (the
    commands `source .venv/bin/activate`): README's commands run there as a user would run them."""
    import shutil
    import sys

    for name in CHECKOUT_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)
    (root / ".venv").symlink_to(sys.prefix)
    return root


def scratch_workdir(workdir: Path, port: int | None = None, unit_lines: str = "") -> Path:
    """`workdir` made a place to run the workflow from: config/ linked in and, with `port`, the shared
    demo target (support.vllm_server.demo_target_dir, fitted once) copied to resources/demo/target with
    its unit rendered for `port`, so that rule build_demo_target has nothing to do (it is planned and run
    from scratch by tests/workflow/test_demo_target_rule.py). `unit_lines` go into the demo unit's
    [Service] section (config/demo/vllm-demo.service.in becomes a file of the workdir's own, written
    before the target so that the rule still has nothing to do)."""
    from support.vllm_server import UNIT_TEMPLATE, demo_target_dir

    from eagle3_pipeline.demo.target import render_unit

    template = UNIT_TEMPLATE.read_text()
    if unit_lines:
        template = template.replace("[Service]\n", "[Service]\n" + unit_lines)
        _config_with_template(workdir / "config", template)
    else:
        (workdir / "config").symlink_to(REPO / "config")
    if port is not None:
        target = workdir / "resources" / "demo" / "target"
        shutil.copytree(demo_target_dir(), target, copy_function=shutil.copyfile)  # fresh mtimes
        unit = render_unit(template, REPO, target, port)
        (workdir / "resources" / "demo" / "vllm-demo.service").write_text(unit)
    return workdir


def _config_with_template(config: Path, template: str) -> None:
    """config/ as the repository's (links), but with its own demo unit template."""
    config.mkdir()
    for item in (REPO / "config").iterdir():
        if item.name != "demo":
            (config / item.name).symlink_to(item)
    (config / "demo").mkdir()
    for item in (REPO / "config" / "demo").iterdir():
        if item.name != "vllm-demo.service.in":
            (config / "demo" / item.name).symlink_to(item)
    (config / "demo" / "vllm-demo.service.in").write_text(template)


def dry_run(
    configfile: Path, *args: str, cwd: Path | None = None, workdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`snakemake -n` with only the job table printed; fails the test with snakemake's stderr.

    Planned in `cwd` (a checkout of its own), from `workdir` (the repository's Snakefile) or, by
    default, from a fresh scratch working directory: never from the checkout itself.
    """
    args = ("-n", "--quiet", "rules", "--configfile", str(configfile), *args)
    result = workdir_run(workdir, *args, timeout=900) if workdir else snakemake(*args, cwd=cwd)
    if result.returncode != 0:
        pytest.fail(
            f"snakemake -n failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return result


def job_counts(stdout: str) -> Counter[str]:
    """The 'Job stats' table of a dry run: rule -> number of jobs (the 'total' row left out)."""
    counts: Counter[str] = Counter()
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.strip() == "Job stats:")
    for line in lines[start + 3 :]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def copy_workdir(source: Path, destination: Path) -> Path:
    """A copy of a finished working directory that Snakemake sees as finished too: files with their
    modification times (copy2), .snakemake/'s records, links kept as links (config/)."""
    return Path(shutil.copytree(source, destination, symlinks=True))


def e2e_overrides(port: int) -> dict[str, Any]:
    """The config of the session's demo run: smaller than the demo default so that the suite fits CI; the
    same code paths."""
    return {
        "run": "e2e",
        "demo": {"port": port},
        "dataset": {"num_samples": 96, "shard_size": 32},
        "generation": {"max_tokens": 256},
        "train": {"epochs": 2},
        # no test reads the timing; one smaller learning-curve point (1 of the 3 shards), the cheapest
        "validate": {
            "max_questions": 8,
            "speedup": False,
            "learning_curve": [0.3, 1.0],
            "by_k_max": 1,  # one more vLLM start: the draft served at k = 1 beside the check's k = 3
        },
    }


# Fake secrets the demo's unit carries in the session's run (outside vLLM's flags too), none of which may
# appear in any file the run writes; DEBUG_PASSWORD_CHECKS=1 checks that numbers are never redacted.
E2E_SECRETS = ("hf_e2eFakeSecretToken0123456789abcdef", "e2e-key-one-1234", "e2e-key-two-5678",
               "e2eCredentialValue99", "e2eDockerPass77", "e2eCurlPass88")  # fmt: skip
E2E_SECRET_LINES = f"""Environment=HF_TOKEN={E2E_SECRETS[0]} E2E_API_KEYS={E2E_SECRETS[1]},{E2E_SECRETS[2]}
Environment=DEBUG_PASSWORD_CHECKS=1
SetCredential=e2e-cred:{E2E_SECRETS[3]}
ExecStartPre=-/usr/bin/docker login -u ci -p {E2E_SECRETS[4]} registry.invalid
ExecStartPost=-/usr/bin/curl -fsS -u alerts:{E2E_SECRETS[5]} http://127.0.0.1:9/started
"""


@pytest.fixture(scope="session")
def demo_e2e_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded demo run once, end to end, for the session (`snakemake --configfile e2e.yaml`, every
    rule from the server snapshot to the validated checkpoint, the shared target, a unit carrying
    E2E_SECRETS): tests/workflow/test_demo_e2e.py reads it, tests/workflow/test_incremental.py grows a
    copy of it. Fails every test that takes it when the run fails."""
    from support.requirements import require

    from eagle3_pipeline.ports import free_port

    require("vllm")
    port = free_port()
    workdir = scratch_workdir(tmp_path_factory.mktemp("demo"), port, unit_lines=E2E_SECRET_LINES)
    (workdir / "e2e.yaml").write_text(yaml.safe_dump(e2e_overrides(port)))
    result = workdir_run(workdir, "--configfile", "e2e.yaml", "--cores", "2")
    if result.returncode != 0:
        pytest.fail(failure(result, workdir / "results" / "e2e" / "logs"))
    return workdir


@pytest.fixture
def kimi_target(tmp_path: Path) -> Path:
    """A folder standing where Kimi-K2.5's weights would be: its config.json (no weights needed to plan)."""
    target = tmp_path / "Kimi-K2.5"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(KIMI_TARGET_CONFIG))
    return target


def planned_jobs(args: list[str], executor: str) -> tuple[list[Any], Any]:
    """The jobs of a real dry-run DAG, built through snakemake.api exactly as the CLI would, from a fresh
    scratch working directory (planning_workdir): never the checkout's results/ or .snakemake/.

    `args` are parsed by Snakemake's own CLI parser, so the workflow profile they name (default-
    resources, set-resources, set-threads, executor settings) is applied by Snakemake itself; paths in
    them must be absolute. Returns (jobs, executor settings).
    """
    from snakemake.api import SnakemakeApi
    from snakemake.cli import parse_args
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    cwd = Path.cwd()
    with planning_workdir() as workdir:
        os.chdir(workdir)
        try:
            # the Snakefile named: profiles/default is found beside it, as the CLI finds it
            _, args_ = parse_args(["-n", "--snakefile", str(REPO / "Snakefile"), *args])
            settings = ExecutorPluginRegistry().get_plugin(executor).get_settings(args_)
            with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
                workflow_api = api.workflow(
                    resource_settings=ResourceSettings(
                        nodes=args_.jobs,
                        cores=args_.cores,  # None for a cluster: threads are not capped locally
                        resources=args_.resources,
                        overwrite_threads=args_.set_threads,
                        overwrite_resources=args_.set_resources,
                        default_resources=args_.default_resources,
                    ),
                    config_settings=ConfigSettings(configfiles=args_.configfile),
                    snakefile=REPO / "Snakefile",
                    workdir=workdir,
                )
                dag_api = workflow_api.dag(DAGSettings())
                dag_api.execute_workflow(executor=executor, pseudo_executor="dryrun")
                jobs = list(workflow_api._workflow.dag.jobs)
        finally:
            os.chdir(cwd)
    return jobs, settings


def planned_dag(workdir: Path, config: dict[str, Any] | None = None) -> Any:
    """The DAG of a dry run of `workdir`'s own Snakefile (a small workflow a test writes there), built in
    this process through snakemake.api: what the Snakemake code patched here does to it can be read."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    cwd = Path.cwd()
    os.chdir(workdir)
    try:
        with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
            workflow_api = api.workflow(
                resource_settings=ResourceSettings(cores=1),
                config_settings=ConfigSettings(config=config or {}),
                snakefile=workdir / "Snakefile",
                workdir=workdir,
            )
            workflow_api.dag(DAGSettings()).execute_workflow(executor="local", pseudo_executor="dryrun")
            return workflow_api._workflow.dag
    finally:
        os.chdir(cwd)


def extraction_rule_command(
    workdir: Path, targets: list[str], *args: str
) -> tuple[list[str], dict[str, str]]:
    """The snakemake arguments and environment of run_extraction_rule (a test that runs it itself)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES")}
    env |= {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    command = [*targets, "--configfile", "c.yaml", "--cores", "1", *args]
    # traces given, not made; the vllm backend's engine job with its extraction jobs
    command += ["--allowed-rules", "check_disk_budget", "extract_hidden_states", "serve_extraction_engine"]
    return command, env


def run_extraction_rule(workdir: Path, targets: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """Rule extract_hidden_states (and its per-shard disk check) for `targets`, run from another
    directory with a PATH without the venv and no GPU, on the traces the test wrote itself."""
    command, env = extraction_rule_command(workdir, targets, *args)
    return workdir_run(workdir, *command, timeout=1200, env=env)
