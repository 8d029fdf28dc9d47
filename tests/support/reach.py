"""What in src/eagle3_pipeline the pipeline itself reaches, read from the source (nothing is imported).

Roots, the code a user's run executes: the workflow (Snakefile and rules/**/*.smk, turned into Python by
Snakemake's own parser, so their imports resolve), scripts/*.py, envs/*.py, the Python examples of
README.md and docs/*.md, every module run as `-m eagle3_pipeline.X` in the Makefile, envs/, config/,
profiles/, README.md or docs/ (its `if __name__ == "__main__":` block), and a package file that
envs/*.sh loads by its path (its functions the script names). From there references are followed
transitively, over units: a module's top-level code (live once something imports the module), its
`__main__` block (live once the module is run with -m: a root, or a live string naming it, as in a
subprocess's argv), a top-level function or class, a method.

A reference is resolved through the imports of the file it is in (re-exports of a package's
__init__ followed): a bare name or a `module.name` attribute reaches that one definition. A method
is reached by name, as attributes are not typed: a live class's method is live once its name appears
as an attribute or a string (getattr) in live code; a dunder method, or any method of a class with a
base outside the package (torch.nn.Module.forward, Thread.run, a handler's do_GET), is live with its
class. A string in live code equal to a definition's name reaches it too (getattr, vLLM loading a
connector class by name). Docstrings are not code: a name in one reaches nothing.

`python tests/support/reach.py` lists each definition no root reaches, with what does reach it: tests
only, benchmarks only, or nothing. tests/unit/test_reachability.py asserts the list is empty.
"""

from __future__ import annotations

import ast
import io
import re
import types
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "eagle3_pipeline"
# `-m eagle3_pipeline.X` in a command (a Makefile recipe, a rule's shell:, a subprocess argv string)
RUN_AS_MAIN = re.compile(r"-m\s+(eagle3_pipeline(?:\.\w+)*)")
# a module named in a live string: imported or run by name (vLLM's kv_connector_module_path)
MODULE_NAME = re.compile(r"\beagle3_pipeline(?:\.\w+)+")
# a fenced Python example of README.md or docs/*.md
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# a package file named by its path (envs/install.sh's .pth loads vllm_cpu_fix.py so)
LOADED_BY_PATH = re.compile(r"src/(eagle3_pipeline/[\w/]+\.py)")
# Methods that code outside the repository calls by name on an object of ours (duck typing: there is no
# base class to tell), each with who calls it: live with their class. The only allow-list.
CALLED_FROM_OUTSIDE = {
    "eagle3_pipeline.vllm_cpu_fix.Finder.find_spec": "Python's import system (a sys.meta_path finder)",
    "eagle3_pipeline.vllm_cpu_fix._PatchingLoader.create_module": "Python's import system (a loader)",
    "eagle3_pipeline.vllm_cpu_fix._PatchingLoader.exec_module": "Python's import system (a loader)",
    "eagle3_pipeline.hidden_states.vllm_connector._Done.query": "vLLM's connector (a copy event's query)",
}
# bases that add no methods a framework calls by name
PLAIN_BASES = {
    "object",
    "Exception",
    "Protocol",
    "NamedTuple",
    "Enum",
    "IntEnum",
    "StrEnum",
    "TypedDict",
    "Generic",
    "ABC",
}


@dataclass
class Unit:
    """Code that runs as one piece: its references, resolved when the whole source is read."""

    key: str
    path: Path
    line: int
    names: set[str] = field(default_factory=set)  # bare names read
    dotted: set[tuple[str, ...]] = field(default_factory=set)  # a.b.c chains headed by a name
    attrs: set[str] = field(default_factory=set)  # every .attr read
    strings: set[str] = field(default_factory=set)  # string constants, docstrings left out
    imports: set[str] = field(default_factory=set)  # modules whose top level this runs


@dataclass
class Source:
    """One file's imports (local name -> (module, attribute or None)) and the module it is, if any."""

    path: Path
    module: str | None
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def module_of(path: Path, src: Path) -> str:
    """The dotted name of the package file `path` under `src`."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _chain(node: ast.Attribute) -> tuple[str, ...] | None:
    parts = [node.attr]
    while isinstance(node.value, ast.Attribute):
        node = node.value
        parts.append(node.attr)
    if isinstance(node.value, ast.Name):
        return (node.value.id, *reversed(parts))
    return None


def _collect(unit: Unit, nodes: list[ast.AST], skip: set[int], docstrings: set[int]) -> None:
    """Read the references of `nodes` into `unit`, not descending into the nodes in `skip` (units of
    their own)."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if id(node) in skip:
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            unit.names.add(node.id)
        elif isinstance(node, ast.Attribute):
            unit.attrs.add(node.attr)
            if (chain := _chain(node)) is not None:
                unit.dotted.add(chain)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            unit.strings.add(node.value)
        elif isinstance(node, ast.Import):
            unit.imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            unit.imports.add(node.module)
            unit.imports.update(f"{node.module}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def _imports(tree: ast.AST) -> dict[str, tuple[str, str | None]]:
    bound: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, None)
                else:  # `import a.b` binds a
                    head = alias.name.split(".")[0]
                    bound[head] = (head, None)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = (node.module, alias.name)
    return bound


def _is_main_guard(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)
    )


def _base_name(base: ast.expr) -> str:
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Attribute):
        return base.attr
    return base.id if isinstance(base, ast.Name) else ""


def snakemake_python(path: Path) -> str:
    """A .smk file (or the Snakefile) as the Python Snakemake runs, from Snakemake's own parser."""
    from snakemake import parser

    source = types.SimpleNamespace(path=path, get_path_or_uri=lambda secret_free=True: str(path))
    # the parser reads through the workflow's source cache: a file's text is all it needs here
    text = types.SimpleNamespace(open=lambda src: io.StringIO(Path(src.path).read_text()))
    workflow = types.SimpleNamespace(sourcecache=text)
    code, _ = parser.parse(source, workflow, {})
    return code


class Index:
    """Every unit of the package, and the files that reach into it."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root, self.src = root, root / "src"
        self.units: dict[str, Unit] = {}
        self.sources: dict[str, Source] = {}  # by unit key
        self.modules: dict[str, Path] = {
            module_of(path, self.src): path for path in sorted((self.src / PACKAGE).rglob("*.py"))
        }
        self.module_imports: dict[str, dict[str, tuple[str, str | None]]] = {}
        self.toplevel: dict[tuple[str, str], str] = {}  # (module, name) -> unit key
        self.methods: dict[str, list[str]] = defaultdict(list)  # method name -> unit keys
        self.class_methods: dict[str, list[str]] = defaultdict(list)
        self.external: set[str] = set()  # classes with a base outside the package
        self.by_name: dict[str, list[str]] = defaultdict(list)
        for module, path in self.modules.items():
            self._add_module(module, path)
        self.toplevel_keys = set(self.toplevel.values())
        self.roots, self.tests, self.benchmarks = self._add_files()
        self.resolved = {key: self.resolve(unit) for key, unit in self.units.items()}

    # -- reading ---------------------------------------------------------------------------------
    def _unit(self, key: str, path: Path, line: int, source: Source) -> Unit:
        self.units[key] = unit = Unit(key, path, line)
        self.sources[key] = source
        return unit

    def _add_module(self, module: str, path: Path) -> None:
        tree = ast.parse(path.read_text(), str(path))
        docstrings = _docstring_ids(tree)
        source = Source(path, module, _imports(tree))
        self.module_imports[module] = source.imports
        body = self._unit(f"module {module}", path, 1, source)
        skip: set[int] = set()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                key = f"{module}.{node.name}"
                self.toplevel[(module, node.name)] = key
                self.by_name[node.name].append(key)
                unit = self._unit(key, path, node.lineno, source)
                skip.add(id(node))
                # decorators, defaults and bases run at import time, with the module
                _collect(body, [*node.decorator_list], set(), docstrings)
                if node.name.startswith("__"):  # a module's __getattr__ runs with it
                    body.names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    self._add_class(node, key, unit, path, source, docstrings)
                else:
                    _collect(unit, [node], set(), docstrings)
            elif _is_main_guard(node):
                skip.add(id(node))
                _collect(self._unit(f"main {module}", path, node.lineno, source), [node], set(), docstrings)
        _collect(body, [n for n in tree.body if id(n) not in skip], skip, docstrings)

    def _add_class(
        self, node: ast.ClassDef, key: str, unit: Unit, path: Path, source: Source, docstrings: set[int]
    ) -> None:
        methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        _collect(unit, [n for n in node.body if n not in methods], set(), docstrings)
        _collect(unit, [*node.bases, *node.keywords, *node.decorator_list], set(), docstrings)
        for method in methods:
            _collect(unit, method.decorator_list, set(), docstrings)
            mkey = f"{key}.{method.name}"
            self.methods[method.name].append(mkey)
            self.class_methods[key].append(mkey)
            self.by_name[method.name].append(mkey)
            _collect(self._unit(mkey, path, method.lineno, source), [method], set(), docstrings)
        for base in node.bases:
            name = _base_name(base)
            if (
                name
                and name not in PLAIN_BASES
                and not name.endswith("Error")
                and not self._ours(base, source)
            ):
                self.external.add(key)

    def _ours(self, base: ast.expr, source: Source) -> bool:
        name = _base_name(base)
        if isinstance(base, ast.Name):
            bound = source.imports.get(name)
            return (source.module, name) in self.toplevel or (
                bound is not None and bound[0].startswith(PACKAGE)
            )
        return False  # attribute bases (torch.nn.Module) are foreign

    def _add_python(self, key: str, path: Path, code: str) -> Unit:
        tree = ast.parse(code, str(path))
        unit = self._unit(key, path, 1, Source(path, None, _imports(tree)))
        _collect(unit, [tree], set(), _docstring_ids(tree))
        return unit

    def _add_files(self) -> tuple[set[str], set[str], set[str]]:
        root = self.root
        roots: set[str] = set()
        # the workflow shares one namespace: a name imported in one .smk is used in another
        workflow = [root / "Snakefile", *sorted((root / "rules").rglob("*.smk"))]
        code = "\n".join(snakemake_python(path) for path in workflow if path.is_file())
        roots.add(self._add_python("workflow", root / "Snakefile", code).key)
        for path in [*sorted((root / "scripts").glob("*.py")), *sorted((root / "envs").glob("*.py"))]:
            roots.add(self._add_python(f"file {path.relative_to(root)}", path, path.read_text()).key)
        docs = [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]
        for path in docs:  # what the docs show a user run: their Python examples
            for i, block in enumerate(PYTHON_BLOCK.findall(path.read_text())):
                roots.add(self._add_python(f"file {path.relative_to(root)} example {i}", path, block).key)
        commands = [p for p in [root / "Makefile", *docs] if p.is_file()] + sorted(
            (root / "envs").glob("*.sh")
        )
        commands += [p for d in ("config", "profiles") for p in sorted((root / d).rglob("*")) if p.is_file()]
        for path in commands:
            text = path.read_text(errors="replace")
            for module in RUN_AS_MAIN.findall(text):
                roots.update(self._main_of(module))
            # a module a shell script loads by its path (a .pth's exec): its top level, and its
            # functions the script calls by name
            for found in LOADED_BY_PATH.findall(text) if path.suffix == ".sh" else []:
                module = module_of(self.src / found, self.src)
                roots.update(self._module(module))
                words = set(re.findall(r"\b\w+\b", text))
                roots.update(k for (m, name), k in self.toplevel.items() if m == module and name in words)
        tests = {
            self._add_python(f"file {p.relative_to(root)}", p, p.read_text()).key
            for p in sorted((root / "tests").rglob("*.py"))
        }
        benchmarks = {
            self._add_python(f"file {p.relative_to(root)}", p, p.read_text()).key
            for p in sorted((root / "benchmarks").rglob("*.py"))
        }
        return roots, tests, benchmarks

    # -- resolving -------------------------------------------------------------------------------
    def _main_of(self, module: str) -> set[str]:
        keys = {f"main {module}", f"main {module}.__main__", f"module {module}.__main__"}
        return {k for k in keys if k in self.units} | self._module(module)

    def _module(self, module: str) -> set[str]:
        """Importing a module runs its package's top level first."""
        parts = module.split(".")
        return {f"module {'.'.join(parts[:i])}" for i in range(1, len(parts) + 1)} & self.units.keys()

    def _target(self, module: str, name: str | None, seen: int = 0) -> set[str]:
        if name is None or f"{module}.{name}" in self.modules:
            return self._module(module if name is None else f"{module}.{name}")
        if (module, name) in self.toplevel:
            return {self.toplevel[(module, name)]}
        bound = self.module_imports.get(module, {}).get(name)
        if bound is not None and seen < 8:  # a package re-exporting a name
            return self._target(*bound, seen + 1)
        if module in self.modules:  # a package's lazy __getattr__: any top-level definition so named
            return {k for k in self.by_name.get(name, []) if k in self.toplevel_keys}
        return set()

    def resolve(self, unit: Unit) -> tuple[set[str], set[str]]:
        """The units `unit` reaches directly, and the attribute and string names it reads (methods)."""
        source = self.sources[unit.key]
        reached: set[str] = set()
        for module in unit.imports:
            if module in self.modules:
                reached |= self._module(module)
        for name in unit.names:
            if name in source.imports:
                reached |= self._target(*source.imports[name])
            elif source.module is not None and (source.module, name) in self.toplevel:
                reached.add(self.toplevel[(source.module, name)])
        for chain in unit.dotted:
            head = source.imports.get(chain[0])
            if head is None or head[1] is not None and f"{head[0]}.{head[1]}" not in self.modules:
                continue  # not a module: its attributes are matched by name
            module = head[0] if head[1] is None else f"{head[0]}.{head[1]}"
            for part in chain[1:]:
                if f"{module}.{part}" in self.modules:
                    module = f"{module}.{part}"
                    reached |= self._module(module)
                    continue
                reached |= self._target(module, part)
                break
        names = set(unit.attrs)
        for text in unit.strings:
            if text.isidentifier():
                names.add(text)
                reached.update(k for k in self.by_name.get(text, []) if k in self.toplevel_keys)
            for module in MODULE_NAME.findall(text):
                if module in self.modules:
                    reached |= self._main_of(module)
                elif module.rpartition(".")[0] in self.modules:
                    reached |= self._target(*module.rsplit(".", 1))
            for module in RUN_AS_MAIN.findall(text):
                reached |= self._main_of(module)
        return reached, names

    def reach(self, roots: set[str]) -> set[str]:
        """Every unit reached from `roots`, transitively."""
        live: set[str] = set()
        names: set[str] = set()
        todo = list(roots)
        while todo:
            key = todo.pop()
            if key in live:
                continue
            live.add(key)
            reached, read = self.resolved[key]
            todo.extend(reached - live)
            for name in read - names:
                names.add(name)
                todo.extend(m for m in self.methods.get(name, []) if m.rpartition(".")[0] in live)
            for method in self.class_methods.get(key, []):
                name = method.rpartition(".")[2]
                if (
                    key in self.external
                    or name.startswith("__")
                    or name in names
                    or method in CALLED_FROM_OUTSIDE
                ):
                    todo.append(method)
        return live

    def definitions(self) -> list[str]:
        """The keys of the package's functions, classes and methods."""
        return [k for k in self.units if not k.startswith(("module ", "main ", "file ", "workflow"))]


def unreached(index: Index) -> dict[str, str]:
    """Each definition and module of the package no root reaches -> what does: "tests", "benchmarks",
    "tests and benchmarks" or "nothing"."""
    live = index.reach(index.roots)
    from_tests = index.reach(index.roots | index.tests)
    from_benchmarks = index.reach(index.roots | index.benchmarks)
    found = {}
    candidates = index.definitions() + [f"module {m}" for m in index.modules]
    for key in candidates:
        if key in live:
            continue
        by = [
            who for who, reached in (("tests", from_tests), ("benchmarks", from_benchmarks)) if key in reached
        ]
        found[key] = " and ".join(by) or "nothing"
    return found


if __name__ == "__main__":
    index = Index()
    for key, by in sorted(unreached(index).items(), key=lambda kv: (kv[1], kv[0])):
        unit = index.units[key]
        print(f"{unit.path.relative_to(index.root)}:{unit.line}: {key} (reached from {by})")  # noqa: T201
