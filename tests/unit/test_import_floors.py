"""The package's imports run down its floors, never up: every module of src/eagle3_pipeline is read with
ast (imports inside functions count too, as do relative ones) and mapped to its floor.

Floors, bottom to top: the foundations (modules that are no stage: settings, config, io, logs, ...),
planning/ (what the rules plan when the workflow is parsed), then the stages in pipeline order, then
demo/ (its head-to-head reads validate/; nothing in the package imports it). A module may import its
own floor and those below it, nothing above: planning/ and the foundations import no stage at all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

PACKAGE = "eagle3_pipeline"
ROOT = Path(__file__).resolve().parents[2] / "src" / PACKAGE

FOUNDATIONS = frozenset(
    {
        "",  # the package's own __init__
        "settings",
        "config",
        "io",
        "logs",
        "locks",
        "ports",
        "fixes",
        "launch",
        "provenance",
        "target_shape",
        "draft_config",  # the draft's shape from the target's config.json (planning sizes state files)
        "state_bytes",  # bytes per token of the stored states (budget.py and the disk cap count with it)
        "servers",  # each server's settings by name (config.py checks the replicas with it)
        "server_json",  # server.json read back (provenance, secrets and the stages read it)
        "secrets",  # redaction (logs.py scrubs every entry point's output with it)
        "vllm_flags",
        "vllm_releases",
        "vllm_compat",
        "vllm_cpu_fix",
        "snakemake_ancient_fix",
        "snakemake_groups_fix",
        "snakemake_producer_fix",
        "snakemake_ready_fix",
        "snakemake_script_fix",
        "snakemake_signature_fix",
        "snakemake_toposort_fix",
    }
)
STAGES = ("server", "prompts", "generate", "traces", "hidden_states", "draft", "validate", "demo")
FLOORS = ("foundations", "planning", *STAGES)
# a stage's module outside its folder: budget.py is the hidden_states stage's disk guard (rule
# check_disk_budget before each extraction; its command and a run's first lines report what the cap's
# plan, planning/, holds at once)
STAGE_MODULES = {"budget": "hidden_states"}


def floor_of(module: str) -> str:
    """The floor of `module` (dotted, without the package's name: "planning.windows", "" for the
    package); a module no floor names fails the test: a new module is given one here."""
    top = module.split(".")[0]
    if module in FOUNDATIONS:
        return "foundations"
    if top in FLOORS:
        return top
    if module in STAGE_MODULES:
        return STAGE_MODULES[module]
    raise AssertionError(f"{PACKAGE}.{module} is on no floor: add it to FOUNDATIONS or a stage")


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of the module at `path` under the package's folder `root` ("" for its __init__)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(base: str, name: str, modules: Mapping[str, str]) -> str:
    """`from base import name`: the submodule `name` when there is one, else `base` itself."""
    child = f"{base}.{name}" if base else name
    return child if child in modules else base


def imported(module: str, source: str, modules: Mapping[str, str]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import of the package in `source`, at any depth of the file."""
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(f"{PACKAGE}."):
                    yield alias.name.removeprefix(PACKAGE).lstrip("."), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from its package, one level up per dot after the first
                parts = package.split(".") if package else []
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            elif node.module == PACKAGE or (node.module or "").startswith(f"{PACKAGE}."):
                base = node.module.removeprefix(PACKAGE).lstrip(".")
            else:
                continue
            for alias in node.names:
                yield _target(base, alias.name, modules), node.lineno


def _is_package(module: str, modules: Mapping[str, str]) -> bool:
    """A package (an __init__.py): the package itself, or a module others are under."""
    return module == "" or any(other.startswith(f"{module}.") for other in modules)


def upward_imports(modules: Mapping[str, str]) -> list[str]:
    """Every import of a later floor by an earlier one, over `modules` ({dotted name: source}), in words
    (one line per importing line and module imported)."""
    found = []
    for module, source in sorted(modules.items()):
        floor = floor_of(module)
        for target, line in imported(module, source, modules):
            above = floor_of(target)
            if FLOORS.index(above) > FLOORS.index(floor):
                found.append(f"{PACKAGE}.{module}:{line} ({floor}) imports {PACKAGE}.{target} ({above})")
    return list(dict.fromkeys(found))


def package_modules() -> dict[str, str]:
    return {module_name(path): path.read_text() for path in sorted(ROOT.rglob("*.py"))}


def test_no_module_imports_a_later_floor():
    modules = package_modules()
    assert {floor_of(module) for module in modules} == set(FLOORS)  # every module placed, every floor used
    assert upward_imports(modules) == []


def test_the_check_sees_lazy_relative_and_package_imports_upward():
    modules = {
        "": "",
        "config": "def check():\n    from eagle3_pipeline.server import replicas\n",
        "planning": "",
        "planning.windows": "from . import variants\nfrom ..validate import learning_curve\n",
        "planning.variants": "import eagle3_pipeline.draft.config\n",
        "server": "",
        "server.replicas": "from eagle3_pipeline import io, planning\n",
        "draft": "",
        "draft.config": "",
        "validate": "",
        "validate.learning_curve": "from eagle3_pipeline.draft import config\n",
        "io": "",
    }
    assert upward_imports(modules) == [
        "eagle3_pipeline.config:2 (foundations) imports eagle3_pipeline.server.replicas (server)",
        "eagle3_pipeline.planning.variants:1 (planning) imports eagle3_pipeline.draft.config (draft)",
        "eagle3_pipeline.planning.windows:2 (planning) imports eagle3_pipeline.validate.learning_curve "
        "(validate)",
    ]
