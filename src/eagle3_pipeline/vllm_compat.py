"""Check each supported vLLM release's own wheel for every vLLM name the project uses; no install, no GPU.

Every module that touches vLLM declares, beside the code that uses them, the names it relies on in a
module-level literal `VLLM_NAMES`, a tuple of entries (KIND, WHERE, WHAT[, {"below": "0.34"}]):

    ("module", "vllm.a.b")                   the module exists
    ("name", "vllm.a.b", "X")                vllm.a.b binds X at module level (a def, class, import,
                                             assignment, also under `if TYPE_CHECKING:`, or a key of
                                             its lazy-import table, as `vllm.LLM`)
    ("member", "vllm.a.b", "Class.attr")     Class (of vllm.a.b) or a base of it has attr: a method,
                                             a field, or `self.attr = ...` in one of its methods
    ("flag", "vllm serve", "--flag")         `vllm serve` takes the flag (arg_utils.py's and the
                                             entrypoints' cli_args.py's literals and dataclass fields)
    ("literal", "vllm/path/", "text")        a string literal equal to text in a file under the path
                                             (metric names, architecture names, speculative methods)
    ("key", "vllm/path/", "word")            word as a string literal, an attribute name or a field
                                             in a file under the path (config keys, JSON fields)
    ("env", "vllm/envs.py", "VLLM_X")        vLLM knows the environment variable
    ("boolean_flags", "eagle3_pipeline.m", "T")  every boolean flag of `vllm serve` is in the table T of
                                             this project's module m (a union over the releases)

A fourth element {"below": "0.34"} limits an entry to the releases before that one (a name the code
uses only where it exists, such as the CPU fix's module). `collect` reads the declarations from the
source with `ast` (no import: the connector module imports vLLM itself); tests/unit/test_vllm_compat.py
fails when a vLLM import in the project is not declared, so that a new dependency cannot be missed.

    python -m eagle3_pipeline.vllm_compat [--cache DIR] [RELEASE ...]    # make vllm-compat

downloads each release's wheel by name (`pip download --no-deps vllm==X`, about 240-340 MB each) into
DIR (default .cache/vllm-wheels, gitignored) once, prints one JSON line per release, and exits 1 when a
name is missing from one.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from eagle3_pipeline.vllm_releases import CHECKED_RELEASES, major_minor

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parents[1]
# where declarations are read: the package, and the tests and benchmarks that import vLLM themselves
DECLARING_ROOTS = (PACKAGE, REPO / "tests", REPO / "benchmarks")
DEFAULT_CACHE = REPO / ".cache" / "vllm-wheels"
# the files `vllm serve`'s parser is built from (vllm/entrypoints/cli/serve.py adds these groups)
PARSER_FILES = ("vllm/engine/arg_utils.py",)
PARSER_FOLDER = "vllm/entrypoints/"


@dataclass(frozen=True)
class Use:
    """One declared use of a vLLM name, and the project file that declares it."""

    kind: str
    where: str
    what: str
    below: tuple[int, int] | None
    declared_in: str

    def applies_to(self, release: str) -> bool:
        version = major_minor(release)
        return self.below is None or (version is not None and version < self.below)

    def __str__(self) -> str:
        return f"{self.kind} {self.where} {self.what}".strip()


def declarations(path: Path) -> list[tuple]:
    """The entries of `path`'s module-level VLLM_NAMES (empty when it declares none)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if isinstance(target, ast.Name) and target.id == "VLLM_NAMES" and node.value is not None:
            return list(ast.literal_eval(node.value))
    return []


def python_files(roots: Iterable[Path] = DECLARING_ROOTS) -> Iterator[Path]:
    for root in roots:
        yield from sorted(p for p in Path(root).rglob("*.py") if "__pycache__" not in p.parts)


def collect(roots: Iterable[Path] = DECLARING_ROOTS) -> list[Use]:
    """Every declared use under `roots`, in file order."""
    uses = []
    for path in python_files(roots):
        for entry in declarations(path):
            kind, where, *rest = entry
            what = rest[0] if rest and isinstance(rest[0], str) else ""
            options = rest[-1] if rest and isinstance(rest[-1], dict) else {}
            below = major_minor(options["below"]) if "below" in options else None
            uses.append(Use(kind, where, what, below, str(path.relative_to(REPO))))
    return uses


class Wheel:
    """A vLLM wheel read as source: its files' text and syntax trees, parsed on demand."""

    def __init__(self, path: Path, overrides: dict[str, str | None] | None = None) -> None:
        self.path = Path(path)
        self.zip = zipfile.ZipFile(self.path)
        self.names = set(self.zip.namelist())
        # a file's text replaced (None: removed), for the check's own test of a name taken away
        self.overrides = dict(overrides or {})
        self._trees: dict[str, ast.Module | None] = {}

    def exists(self, name: str) -> bool:
        if name in self.overrides:
            return self.overrides[name] is not None
        return name in self.names

    def text(self, name: str) -> str | None:
        if name in self.overrides:
            return self.overrides[name]
        return self.zip.read(name).decode("utf-8", "replace") if name in self.names else None

    def tree(self, name: str) -> ast.Module | None:
        if name not in self._trees:
            text = self.text(name)
            self._trees[name] = ast.parse(text) if text is not None else None
        return self._trees[name]

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((f for f in (f"{base}.py", f"{base}/__init__.py") if self.exists(f)), None)

    def files_under(self, prefix: str) -> list[str]:
        names = (self.names | set(self.overrides)) - {n for n, t in self.overrides.items() if t is None}
        return sorted(n for n in names if n.startswith(prefix) and n.endswith(".py"))


def _bound_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level, in any branch (if/try), and its lazy-import table's keys."""
    names: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in targets):
                names.update(k.value for k in getattr(node.value, "keys", []) if isinstance(k, ast.Constant))
        elif isinstance(node, ast.If | ast.Try):
            stack.extend([*node.body, *node.orelse, *getattr(node, "finalbody", [])])
            stack.extend(s for h in getattr(node, "handlers", []) for s in h.body)
    return names


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def _class_attributes(cls: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    found.add(t.id)
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    found.add(t.attr)
    return found


def _imported_from(tree: ast.Module, name: str) -> str | None:
    """The module `name` is imported from in `tree` (`from vllm.x import name`), if any."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            return node.module
    return None


def has_member(wheel: Wheel, module: str, dotted: str, depth: int = 0) -> bool:
    """Class.attr of `dotted` in `module`, through the class's bases (in vLLM) when not its own."""
    class_name, attr = dotted.split(".", 1)
    file = wheel.module_file(module)
    tree = wheel.tree(file) if file else None
    cls = _find_class(tree, class_name) if tree else None
    if cls is None or depth > 8:
        return False
    if attr in _class_attributes(cls):
        return True
    for base in cls.bases:
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        source = _imported_from(tree, base_name) if base_name else None
        if base_name and has_member(wheel, source or module, f"{base_name}.{attr}", depth + 1):
            return True
    return False


@cache
def _words(text: str, literals_only: bool) -> frozenset[str]:
    words = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            words.add(node.value)
        elif not literals_only and isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif not literals_only and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            words.add(node.target.id)  # a field of a request or response model: a JSON key
    return frozenset(words)


def _appears(wheel: Wheel, prefix: str, word: str, literals_only: bool) -> bool:
    return any(word in _words(wheel.text(f) or "", literals_only) for f in wheel.files_under(prefix))


def serve_flags(wheel: Wheel) -> set[str]:
    """The long flags `vllm serve` takes, read statically: literal `--x` strings of its parser's files
    and `--x-y` of every dataclass field (x_y) of the entrypoints' cli_args.py (vLLM derives those)."""
    flags: set[str] = set()
    files = [*PARSER_FILES, *(f for f in wheel.files_under(PARSER_FOLDER) if f.endswith("cli_args.py"))]
    for file in files:
        tree = wheel.tree(file)
        if tree is None:
            continue
        flags.update(w for w in _words(wheel.text(file) or "", True) if w.startswith("--"))
        if file.endswith("cli_args.py"):
            for node in ast.walk(tree):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    flags.add("--" + node.target.id.replace("_", "-"))
    return flags


def _bool_fields(cls: ast.ClassDef) -> set[str]:
    """The fields of a dataclass typed bool (or bool | None), as the flags vLLM derives from them."""
    typed = [f for f in cls.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)]
    booleans = [f for f in typed if ast.unparse(f.annotation) in ("bool", "bool | None", "Optional[bool]")]
    return {"--" + f.target.id.replace("_", "-") for f in booleans}


def serve_boolean_flags(wheel: Wheel) -> set[str]:
    """The boolean flags of `vllm serve`, read statically: EngineArgs fields typed bool that arg_utils.py
    registers under their flag, every bool field of the entrypoints' cli_args.py dataclasses (vLLM
    registers them all), and any add_argument whose action is store_true/false or BooleanOptionalAction.
    On 0.32.0 this gives exactly the booleans its parser gave (vllm_flags.py)."""
    registered, booleans, engine_fields = set(), set(), set()
    files = [*PARSER_FILES, *(f for f in wheel.files_under(PARSER_FOLDER) if f.endswith("cli_args.py"))]
    for file in files:
        tree = wheel.tree(file)
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                names = {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                }
                registered |= names
                action = next((ast.unparse(k.value) for k in node.keywords if k.arg == "action"), "")
                if action.endswith(("store_true'", "store_false'", "BooleanOptionalAction")):
                    booleans |= names
            elif isinstance(node, ast.ClassDef) and file.endswith("cli_args.py"):
                booleans |= _bool_fields(node)
            elif isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
                engine_fields |= _bool_fields(node)
    return booleans | (engine_fields & registered)


def missing_booleans(wheel: Wheel, use: Use) -> set[str]:
    """The boolean flags of the release that the table `use` names (module, attribute) lacks."""
    table = getattr(importlib.import_module(use.where), use.what)
    return serve_boolean_flags(wheel) - set(table)


def check_use(wheel: Wheel, use: Use) -> bool:
    """Whether `use` holds in `wheel`."""
    if use.kind == "module":
        return wheel.module_file(use.where) is not None
    if use.kind == "name":
        file = wheel.module_file(use.where)
        return file is not None and use.what in _bound_names(wheel.tree(file))
    if use.kind == "member":
        return has_member(wheel, use.where, use.what)
    if use.kind == "flag":
        return use.what in serve_flags(wheel)
    if use.kind in ("literal", "key"):
        return _appears(wheel, use.where, use.what, literals_only=use.kind == "literal")
    if use.kind == "boolean_flags":
        return not missing_booleans(wheel, use)
    if use.kind == "env":
        return use.what in _words(wheel.text(use.where) or "", True)
    raise ValueError(f"unknown kind {use.kind!r} ({use.declared_in})")


def check_wheel(wheel: Wheel, release: str, uses: Iterable[Use]) -> list[Use]:
    """The uses that apply to `release` and do not hold in its wheel (empty: compatible)."""
    return [use for use in uses if use.applies_to(release) and not check_use(wheel, use)]


def wheel_path(release: str, cache_dir: Path) -> Path:
    """The cached wheel of `release`, downloaded by name from the package index the first time."""
    found = sorted(Path(cache_dir).glob(f"vllm-{release}-*.whl"))
    if found:
        return found[0]
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    subprocess.run([*command, "--dest", str(cache_dir), f"vllm=={release}"], check=True)
    found = sorted(Path(cache_dir).glob(f"vllm-{release}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download of vllm=={release} left no wheel in {cache_dir}")
    return found[0]


def report(wheel: Wheel, release: str, uses: list[Use]) -> dict[str, object]:
    """One release's result: how many uses apply to it, and each one missing from its wheel."""
    missing = check_wheel(wheel, release, uses)
    named = [f"{use} ({use.declared_in})" for use in missing]
    for use in (u for u in missing if u.kind == "boolean_flags"):
        named += [f"boolean flag {flag} not in {use.what}" for flag in sorted(missing_booleans(wheel, use))]
    return {"release": release, "checked": sum(u.applies_to(release) for u in uses), "missing": named}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs="*", default=list(CHECKED_RELEASES))
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    uses = collect()
    results = [report(Wheel(wheel_path(r, args.cache)), r, uses) for r in args.releases]
    for result in results:
        print(json.dumps(result))  # noqa: T201 - the command's output
    return 1 if any(result["missing"] for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
