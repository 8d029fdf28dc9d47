"""`make mutants`: mutation testing (mutmut 3) of the modules where a silent error costs most.

    python tests/mutation/run.py [NAME ...] [--jobs N] [--minutes M]     (NAME: a key of MODULES)

Each module is mutated in a workspace of its own, mutants/<name>/: links to this checkout's src, tests,
config, rules, scripts and Snakefile, and a pyproject.toml that is the project's with a [tool.mutmut]
section added, naming that one file and its fast unit tests (MODULES). mutmut copies the workspace into
mutants/<name>/mutants/ (the whole package under src/, the one file mutated; the tests beside it), runs
the tests once to learn which test calls which function, then runs each mutant against only the tests
that call the function it changed (`pytest -x`, in a process forked from one that collected them once).
mutmut mutates function and method bodies only: module-level constants, dataclass fields and decorated
functions (@staticmethod and @classmethod aside) are left as they are; and it learns which test calls a
function in the test's own process, so code a test runs only in a child process has "no tests".

Every run starts the named modules afresh. Results: mutants/<name>/survivors.txt (each surviving
mutant's diff), mutants/<name>/summary.json, and mutants/summary.md (one row per module, this run's
modules merged into the earlier rows). docs/testing.md records a run and judges its survivors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from mutmut.stats import status_by_exit_code

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "mutants"
MUTMUT = Path(sys.executable).parent / "mutmut"
# what the tests read besides the package and themselves (config/schema.yaml, the Snakefile, ...)
LINKED = ("src", "tests", "config", "rules", "scripts", "Snakefile")
PLUGIN = "mutation_plugin"  # tests/mutation/pytest_plugin.py, linked into the workspace under this name


@dataclass(frozen=True)
class Target:
    path: str  # the file mutated, from the repository root
    tests: tuple[str, ...]  # what pytest runs against it: test files or node ids under tests/unit
    left_out: str = ""  # tests that exercise it but are not run here, and why


MODULES = {
    # the serve check's verdict: served acceptance against the offline replay
    "matched": Target(
        "src/eagle3_pipeline/validate/matched.py",
        (
            "tests/unit/test_validate_slices.py",
            "tests/unit/test_validate_intervals.py",  # the paired bootstrap path
            "tests/unit/test_validate_served.py",  # reference_of, replayed_counts through the check
        ),
    ),
    # what keeps API keys and passwords out of logs, records and command lines
    "secrets": Target(
        "src/eagle3_pipeline/secrets.py",
        ("tests/unit/test_server_secrets.py", "tests/unit/test_server_secrets_context.py"),
        "test_server_units.py and test_server_lifecycle.py call it too (units parsed, servers started)",
    ),
    # every entry point's log setup through the redacting filter
    "logs": Target(
        "src/eagle3_pipeline/logs.py",
        ("tests/unit/test_logs.py",),
        "none: test_logs.py runs its job in a child process (setup_logging replaces sys.stderr and the "
        "excepthook), where mutmut records no test, so every mutant reads 'no tests' (the tool's limit)",
    ),
    # the generation journal: a killed shard resumes without loss or duplicate
    "journal": Target(
        "src/eagle3_pipeline/generate/journal.py",
        ("tests/unit/test_generate_journal.py",),
        "test_generate_client.py (killed and resumed shards: 50 s of subprocesses and waits)",
    ),
    # rerun triggers: what Snakemake records as params (as_params, runtime_only) and the typed sections
    "settings": Target(
        "src/eagle3_pipeline/settings.py",
        ("tests/unit/test_settings.py",),
        "tests/workflow/test_rerun_triggers.py (a recorded Snakemake run); most unit tests build settings",
    ),
    # the disk budget: the estimates and the free-space guard, and what the cap's plan holds at once
    "budget": Target("src/eagle3_pipeline/budget.py", ("tests/unit/test_budget.py",)),
    # the disk cap's windows: cut from byte counts, each with its packing reserve
    "window_plan": Target(
        "src/eagle3_pipeline/planning/window_plan.py",
        ("tests/unit/test_planning_window_plan.py", "tests/unit/test_budget.py"),
        "test_draft_window_batches.py and test_draft_train.py (they call the window planner)",
    ),
    # the disk cap read from the config and the checked traces, and the plan's check before extraction
    "disk_cap": Target(
        "src/eagle3_pipeline/planning/disk_cap.py",
        ("tests/unit/test_planning_disk_cap.py", "tests/unit/test_budget.py"),
    ),
    # the TTT loss (the chunked one's slow cases left out)
    "ttt": Target(
        "src/eagle3_pipeline/draft/ttt.py",
        (
            "tests/unit/test_draft_ttt.py",
            "tests/unit/test_draft_loss.py::test_chunked_loss_and_gradients_equal_the_reference[True-1-24]",
            "tests/unit/test_draft_loss.py::test_target_in_draft_is_the_reference_mask",
        ),
        "test_draft_loss.py's other three cases (28 s: one chunk, 4200-element chunks, bf16 autocast) and "
        "test_draft_train.py",
    ),
    # the draft's TTT attention (the linear kernel against the dense reference)
    "attention": Target("src/eagle3_pipeline/draft/attention.py", ("tests/unit/test_draft_attention.py",)),
}

NO_TEST_CALLS = "could not find any test case for any mutant"  # mutmut's words when it stops early
STATUSES = ("killed", "survived", "timeout", "no tests", "suspicious", "segfault", "not checked")


def mutmut_config(target: Target) -> str:
    """The [tool.mutmut] section of a module's workspace."""
    tests = [t for t in target.tests if (REPO / t.split("::")[0]).exists()]
    section = {
        "source_paths": ["src/eagle3_pipeline"],
        "only_mutate": [target.path],
        "pytest_add_cli_args_test_selection": tests,
        # tests/mutation/pytest_plugin.py; no cache: the workspace copy is thrown away
        # (plugin autoload off: xdist alone is needed, for tests/conftest.py's xdist hook)
        "pytest_add_cli_args": ["-p", PLUGIN, "-p", "xdist.plugin", "-p", "no:cacheprovider"],
        "also_copy": [name for name in LINKED if name not in ("src", "tests")] + [f"{PLUGIN}.py"],
        "process_isolation": "forkserver",  # the tests import torch: fork from a process that never ran one
        "use_git_change_detection": False,  # every run starts afresh
        "use_setproctitle": False,
    }
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in section.items()]
    return "\n".join(lines) + "\n"


def workspace(name: str, target: Target) -> Path:
    """mutants/<name>/, fresh: links to the checkout and the project's pyproject.toml plus [tool.mutmut]."""
    where = OUT / name
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    for item in LINKED:
        (where / item).symlink_to(REPO / item)
    (where / f"{PLUGIN}.py").symlink_to(Path(__file__).with_name("pytest_plugin.py"))
    project = (REPO / "pyproject.toml").read_text()
    if "mutmut" in tomllib.loads(project).get("tool", {}):
        raise SystemExit("pyproject.toml has a [tool.mutmut] section: tests/mutation/run.py writes its own")
    (where / "pyproject.toml").write_text(project + mutmut_config(target))
    return where


def mutmut(where: Path, *args: str, deadline: float | None = None, log: Path | None = None) -> int:
    """Run mutmut in a workspace (stdout to `log`); past `deadline` it is interrupted, as Ctrl-C would."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    with open(log or os.devnull, "a") as out:
        proc = subprocess.Popen(
            [str(MUTMUT), *args], cwd=where, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            return proc.wait(timeout=None if deadline is None else max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # mutmut stops its workers; unfinished mutants stay "not checked"
            try:
                return proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()


def results(where: Path, target: Target) -> dict[str, str]:
    """mutant name -> status, from mutmut's record of the file (none before it generated the mutants)."""
    meta = where / "mutants" / (target.path + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {key: status_by_exit_code[code] for key, code in codes.items()}


def count_mutants(target: Target) -> int:
    """How many mutants mutmut makes of the file (for a module whose tests do not exist)."""
    from mutmut.mutation.file_mutation import mutate_file_contents

    source = (REPO / target.path).read_text()
    return len(mutate_file_contents(target.path, source).mutant_names)


def write_survivors(where: Path, target: Target, status: dict[str, str]) -> None:
    """mutants/<name>/survivors.txt: each mutant that was not killed, as `mutmut show` prints it."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    here = Path.cwd()
    os.chdir(where)  # mutmut reads its files relative to the workspace
    try:
        with open("survivors.txt", "w") as out:
            for key, s in status.items():
                out.write(f"## {s}: {key}\n{get_diff_for_mutant(key, path=target.path)}\n\n")
    finally:
        os.chdir(here)


def run_module(name: str, target: Target, jobs: int, minutes: float) -> dict:
    where = workspace(name, target)
    log = where / "mutmut.log"
    start = time.monotonic()
    counts = dict.fromkeys(STATUSES, 0)
    if not any((REPO / t.split("::")[0]).exists() for t in target.tests):
        counts["no tests"] = count_mutants(target)
        status = {}
    else:
        deadline = start + minutes * 60 if minutes else None
        code = mutmut(where, "run", "--max-children", str(jobs), deadline=deadline, log=log)
        status = results(where, target)
        if not status:
            raise SystemExit(f"{name}: mutmut made no mutants (exit {code}); see {log}")
        if code and NO_TEST_CALLS in log.read_text():  # mutmut stopped: no test calls the module
            status = dict.fromkeys(status, "no tests")
        for s in status.values():
            counts[s if s in counts else "suspicious"] += 1
    wall = time.monotonic() - start
    survivors = sorted(k for k, s in status.items() if s not in ("killed", "timeout"))
    write_survivors(where, target, {key: status[key] for key in survivors})
    summary = {
        "module": name,
        "file": target.path,
        "tests": list(target.tests),
        "left_out": target.left_out,
        "mutants": sum(counts.values()),
        **counts,
        "score": score(counts),
        "wall_s": round(wall),
        "date": date.today().isoformat(),
    }
    (where / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def score(counts: dict) -> float | None:
    """Killed (timeouts included) out of the mutants that ran or had no test to run (those count as
    survivors); None when none ran (a run stopped before its first mutant)."""
    killed = counts["killed"] + counts["timeout"]
    ran = killed + counts["survived"] + counts["suspicious"] + counts["segfault"]
    return round(100 * killed / (ran + counts["no tests"]), 1) if ran or not counts["not checked"] else None


def table(rows: list[dict]) -> str:
    head = (
        "| module | mutants | killed | survived | timeout | no tests | not checked | other | score | wall |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        other = r["suspicious"] + r["segfault"]
        figure = score(r)
        score_text = "n/a" if figure is None else f"{figure}%" + (" (partial)" if r["not checked"] else "")
        lines.append(
            f"| {r['module']} (`{r['file']}`) | {r['mutants']} | {r['killed']} | {r['survived']} | "
            f"{r['timeout']} | {r['no tests']} | {r['not checked']} | {other} | {score_text} | "
            f"{r['wall_s']} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"default: all, in this order: {' '.join(MODULES)}")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument(
        "--minutes", type=float, default=0, help="stop each module after this long (0: never)"
    )
    args = parser.parse_args()
    names = [n for arg in args.modules for n in arg.replace(",", " ").split()] or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {', '.join(MODULES)}")
    OUT.mkdir(exist_ok=True)
    rows = []
    for name in names:
        sys.stdout.write(f"== {name}: {MODULES[name].path}\n")
        sys.stdout.flush()
        row = run_module(name, MODULES[name], args.jobs, args.minutes)
        rows.append(row)
        sys.stdout.write(table([row]).splitlines()[-1] + f"\n   survivors: mutants/{name}/survivors.txt\n")
    earlier = {}
    for name in MODULES:
        saved = OUT / name / "summary.json"
        if name not in names and saved.exists():
            earlier[name] = json.loads(saved.read_text())
    merged = [r for r in ({**earlier, **{r["module"]: r for r in rows}}.get(n) for n in MODULES) if r]
    (OUT / "summary.md").write_text(table(merged))
    sys.stdout.write("\n" + table(merged))


if __name__ == "__main__":
    main()
