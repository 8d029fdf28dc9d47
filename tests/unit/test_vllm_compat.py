"""The per-release compatibility check (issue 48, item 5): every vLLM name the project uses is declared
beside its code (VLLM_NAMES, gathered by vllm_compat.collect), an undeclared vLLM import or metric
fails here, and each supported release's own wheel (cached by `make vllm-compat`) holds every declared
name, while the same wheel with one used name taken out of its file fails naming it. The check's rules
per kind run on a small wheel built here, so they are tested on any machine.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
from support.requirements import require

from eagle3_pipeline import vllm_compat
from eagle3_pipeline.hidden_states.vllm_worker import CONFIG_FIELDS
from eagle3_pipeline.vllm_releases import CHECKED_RELEASES

USES = vllm_compat.collect()
# `from vllm.x import (a, b)` and `import vllm.x`, in code or in the scripts tests hand to .venv-vllm
IMPORT = re.compile(r"^\s*from (vllm[\w.]*) import (\([^)]*\)|[^\n#]+)|^\s*import (vllm[\w.]*)", re.M)
METRIC = re.compile(r"""["'](vllm:[a-z_]+?)(?:_total)?["']""")
SELF = {Path(__file__).resolve(), Path(vllm_compat.__file__).resolve()}


def _used(path: Path) -> set[tuple[str, str]]:
    """(module, name) of every vLLM import in `path` ((module, "") for `import vllm.x`), and
    ("metric", name) of every vLLM metric literal outside tests/unit (whose parsing tests write
    metric text of their own)."""
    text, found = path.read_text(), set()
    for match in IMPORT.finditer(text):
        if match[3]:
            found.add((match[3], ""))
            continue
        for name in match[2].strip("()").replace("\n", " ").split(","):
            if name.strip():
                found.add((match[1], name.split(" as ")[0].strip()))
    if "unit" in path.relative_to(vllm_compat.REPO).parts[:2]:
        return found
    return found | {("metric", m) for m in METRIC.findall(text)}


def _declared(path: Path) -> set[tuple[str, str]]:
    uses = [u for u in USES if u.declared_in == str(path.relative_to(vllm_compat.REPO))]
    return (
        {(u.where, u.what) for u in uses}
        | {(u.where, "") for u in uses if u.kind == "module"}
        | {("metric", u.what) for u in uses if u.kind == "literal" and u.what.startswith("vllm:")}
    )


def test_every_vllm_import_and_metric_in_the_project_is_declared_beside_it():
    undeclared = [
        f"{path.relative_to(vllm_compat.REPO)}: {module} {name}".strip()
        for path in vllm_compat.python_files()
        if path.resolve() not in SELF
        for module, name in sorted(_used(path) - _declared(path))
    ]
    assert not undeclared, "declare these in the module's VLLM_NAMES:\n" + "\n".join(undeclared)


def test_every_engine_config_field_read_back_is_declared():
    members = {u.what.split(".")[-1] for u in USES if u.kind == "member" and "vllm_worker" in u.declared_in}
    for path in CONFIG_FIELDS.values():
        assert set(path.split(".")) <= members, path


# A wheel in miniature: what each kind reads (a lazy-import table, a base class in another module,
# `self.x` in a method, a parser's literal flag and a typed dataclass field, a metric, a config key)
TINY = {
    "vllm/__init__.py": 'MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM"}\n',
    "vllm/base.py": "class Base:\n    def __init__(self):\n        self._lock_fds = {}\n",
    "vllm/connector.py": (
        "from vllm.base import Base\n"
        "class Connector(Base):\n    def _submit_async_write(self, pending):\n        pass\n"
    ),
    "vllm/engine/arg_utils.py": (
        "import argparse\nclass EngineArgs:\n    monokernel: bool = False\n    seed: int = 0\n"
        "def add(parser, kw):\n"
        "    parser.add_argument('--monokernel', **kw['monokernel'])\n"
        "    parser.add_argument('--seed', type=int)\n"
    ),
    "vllm/entrypoints/openai/cli_args.py": "class FrontendArgs:\n    enable_auto_tool_choice: bool = False\n",
    "vllm/v1/metrics.py": "NAME = 'vllm:spec_decode_num_drafts'\n",
    "vllm/models/eagle.py": "def read(config):\n    return config.norm_before_residual\n",
    "vllm/envs.py": "environment_variables = {'VLLM_ENABLE_V1_MULTIPROCESSING': None}\n",
}
TINY_USES = [
    ("name", "vllm", "LLM"),
    ("member", "vllm.connector", "Connector._submit_async_write"),
    ("member", "vllm.connector", "Connector._lock_fds"),
    ("flag", "vllm serve", "--monokernel"),
    ("flag", "vllm serve", "--enable-auto-tool-choice"),
    ("literal", "vllm/v1/", "vllm:spec_decode_num_drafts"),
    ("key", "vllm/models/", "norm_before_residual"),
    ("env", "vllm/envs.py", "VLLM_ENABLE_V1_MULTIPROCESSING"),
]


def _tiny(tmp_path: Path, files: dict[str, str]) -> vllm_compat.Wheel:
    path = tmp_path / "vllm-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return vllm_compat.Wheel(path)


def _uses(entries) -> list[vllm_compat.Use]:
    return [vllm_compat.Use(kind, where, what, None, "tests") for kind, where, what in entries]


def test_each_kind_finds_its_name_in_a_wheel(tmp_path):
    assert vllm_compat.check_wheel(_tiny(tmp_path, TINY), "0.0.0", _uses(TINY_USES)) == []
    assert vllm_compat.serve_boolean_flags(_tiny(tmp_path, TINY)) == {
        "--monokernel",
        "--enable-auto-tool-choice",
    }


@pytest.mark.parametrize(
    ("file", "old", "new", "missing"),
    [
        ("vllm/base.py", "self._lock_fds = {}", "pass", "Connector._lock_fds"),
        ("vllm/connector.py", "_submit_async_write", "_submit_write", "Connector._submit_async_write"),
        ("vllm/__init__.py", '"LLM"', '"LLMEngine"', "LLM"),
        ("vllm/engine/arg_utils.py", "'--monokernel'", "'--mono'", "--monokernel"),
        ("vllm/v1/metrics.py", "num_drafts", "num_proposals", "vllm:spec_decode_num_drafts"),
        ("vllm/models/eagle.py", "norm_before_residual", "norm_first", "norm_before_residual"),
    ],
)
def test_a_name_taken_out_of_a_wheel_fails_naming_it(tmp_path, file, old, new, missing):
    files = {**TINY, file: TINY[file].replace(old, new)}
    failed = vllm_compat.check_wheel(_tiny(tmp_path, files), "0.0.0", _uses(TINY_USES))
    assert [use.what for use in failed] == [missing]


def test_an_entry_limited_to_older_releases_is_not_asked_of_newer_ones():
    use = vllm_compat.Use("module", "vllm.utils.cpu_triton_utils", "", (0, 34), "x")
    assert use.applies_to("0.33.0") and not use.applies_to("0.34.0")


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    require("vllm_wheels")
    return {r: next(vllm_compat.DEFAULT_CACHE.glob(f"vllm-{r}-*.whl")) for r in CHECKED_RELEASES}


@pytest.mark.parametrize("release", CHECKED_RELEASES)
def test_every_supported_release_holds_every_declared_name(wheels, release):
    result = vllm_compat.report(vllm_compat.Wheel(wheels[release]), release, USES)
    assert result["missing"] == [] and result["checked"] > 150, result


CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"


def test_a_used_name_removed_from_a_real_wheel_fails_the_check(wheels):
    real = vllm_compat.Wheel(wheels["0.34.0"])
    text = real.text(CONNECTOR).replace("self._lock_fds", "self._held_fds")  # the sync connector's
    result = vllm_compat.report(vllm_compat.Wheel(wheels["0.34.0"], {CONNECTOR: text}), "0.34.0", USES)
    assert result["missing"] == [
        "member vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector "
        "ExampleHiddenStatesConnector._lock_fds (src/eagle3_pipeline/hidden_states/vllm_connector.py)"
    ]


def test_a_boolean_flag_missing_from_the_table_fails_the_check(wheels, monkeypatch):
    from eagle3_pipeline import vllm_flags

    monkeypatch.setattr(vllm_flags, "BOOLEAN_FLAGS", vllm_flags.BOOLEAN_FLAGS - {"--monokernel"})
    result = vllm_compat.report(vllm_compat.Wheel(wheels["0.33.0"]), "0.33.0", USES)
    assert "boolean flag --monokernel not in BOOLEAN_FLAGS" in result["missing"]
