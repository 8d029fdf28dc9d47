"""Where settings flow: validated once into typed sections (settings.py), read by the rules from
SETTINGS, handed to the package as `*Settings` objects. These tests read the source: a dict config
section slipping back into a signature, a `.get(key, X_DEFAULTS.key)` fallback outside settings.py, a
raw `config[...]` in a rule, or the server stage importing from validate/ fails here by name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "eagle3_pipeline"
# parameter names that denote a config section (a model's own config.json is named `model_config`)
SECTION_NAMES = {
    "config",
    "dataset",
    "demo",
    "draft",
    "generation",
    "hidden_states",
    "selection",
    "server",
    "ssh",
    "train",
    "traces",
    "validate",
    "vllm",
}
PLAIN_MAPPING = re.compile(r"\b(dict|Mapping|MutableMapping|Any)\b")
# the server stage: its package and the scripts of rules/server.smk
SERVER_SCRIPTS = ("snapshot_server.py", "stop_server.py", "check_replica.py", "check_replicas.py")


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _section_params_as_mappings(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            name = arg.arg
            if not (name in SECTION_NAMES or name.endswith("_cfg") or name == "cfg"):
                continue
            hint = ast.unparse(arg.annotation) if arg.annotation else "unannotated"
            if hint == "unannotated" or PLAIN_MAPPING.search(hint) and "Settings" not in hint:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({name}: {hint})")
    return found


def test_no_package_function_takes_a_config_section_as_a_mapping() -> None:
    found = [line for path in _sources() for line in _section_params_as_mappings(path)]
    assert not found, "take the section's *Settings (eagle3_pipeline.settings):\n" + "\n".join(found)


def test_schema_defaults_are_read_in_settings_py_only() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number} {line.strip()}"
        for path in _sources()
        if path.name != "settings.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"[A-Z]+_DEFAULTS\b|\.get\(\"[a-z_]+\", [A-Z_]+\.", line)
    ]
    assert not found, "read the typed section's field instead:\n" + "\n".join(found)


def test_rules_read_settings_only() -> None:
    raw = re.compile(r"\bconfig\s*(\[|\.get\b|\.items\b)|\(\s*config\s*[,)]")
    found = [
        f"{path.relative_to(ROOT)}:{number} {line.strip()}"
        for path in [
            ROOT / "Snakefile",
            *sorted((ROOT / "rules").glob("*.smk")),
            *sorted((ROOT / "rules").glob("common/*.smk")),
        ]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if raw.search(line) and "check_config" not in line and "build_settings" not in line
    ]
    assert not found, "read SETTINGS (rules/common.smk), not the raw config:\n" + "\n".join(found)


def test_the_server_stage_imports_nothing_from_validate() -> None:
    stage = [*sorted((SRC / "server").rglob("*.py")), *(ROOT / "scripts" / name for name in SERVER_SCRIPTS)]
    found = [
        f"{path.relative_to(ROOT)}:{number} {line.strip()}"
        for path in stage
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"eagle3_pipeline\.validate\b|from eagle3_pipeline import .*\bvalidate\b", line)
    ]
    assert not found, "the server stage must not depend on validate/:\n" + "\n".join(found)
