"""No code in the package that only tests or benchmarks reach: every function, class, method and module
of src/eagle3_pipeline is reached from what a user's run executes (the rules, scripts/, the Makefile's
and the docs' commands; support.reach says how it is read). Code only a test reaches is removed, with
its tests re-pointed at the path the rules drive; code only a benchmark needs lives in benchmarks/."""

from __future__ import annotations

import textwrap
from pathlib import Path

from support.reach import Index, unreached


def test_every_definition_of_the_package_is_reached_from_the_pipeline():
    index = Index()
    found = unreached(index)
    listed = "\n".join(
        f"  {index.units[key].path.relative_to(index.root)}:{index.units[key].line} {key} ({by})"
        for key, by in sorted(found.items())
    )
    assert found == {}, f"reached only from tests or benchmarks, or from nothing:\n{listed}"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_check_tells_what_only_tests_benchmarks_or_nothing_reach(tmp_path):
    """The reader itself, on a tree of its own: a rule's import, a script's call, a subprocess run by
    module name and a getattr reach what they name and what that calls; a function called only by an
    unreached one, one only a test calls and one only a benchmark calls are each found."""
    root = _tree(
        tmp_path,
        {
            "src/eagle3_pipeline/__init__.py": "",
            "src/eagle3_pipeline/stage.py": """
                import subprocess

                def planned():
                    return helper()

                def helper():
                    return Runner().run_it() + getattr(Runner(), "by_name")()

                class Runner:
                    def run_it(self):
                        return 1

                    def by_name(self):
                        return 2

                    def never(self):
                        return only_from_dead()

                def start():
                    subprocess.run(["python", "-m", "eagle3_pipeline.worker"])

                def dead():
                    return only_from_dead()

                def only_from_dead():
                    return 3

                def tested():
                    return 4

                def benchmarked():
                    return 5
            """,
            "src/eagle3_pipeline/worker.py": """
                def serve():
                    return 6

                if __name__ == "__main__":
                    serve()
            """,
            "Snakefile": """
                from eagle3_pipeline.stage import planned

                rule all:
                    params:
                        plan=planned(),
                    script:
                        "scripts/run.py"
            """,
            "scripts/run.py": "from eagle3_pipeline import stage\n\nstage.start()\n",
            "tests/test_stage.py": """
                from eagle3_pipeline.stage import Runner, tested

                tested()
                Runner().never()
            """,
            "benchmarks/bench.py": "from eagle3_pipeline import stage\n\nstage.benchmarked()\n",
        },
    )
    assert unreached(Index(root)) == {
        "eagle3_pipeline.stage.Runner.never": "tests",
        "eagle3_pipeline.stage.dead": "nothing",
        "eagle3_pipeline.stage.only_from_dead": "tests",  # through Runner.never
        "eagle3_pipeline.stage.tested": "tests",
        "eagle3_pipeline.stage.benchmarked": "benchmarks",
    }
