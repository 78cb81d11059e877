"""The library's shape: imports flow one way (no circle, no import inside a function that climbs back to a module
that imports the importer), the core never imports the plugin, and no library module is over 500 lines. Importing a
module runs the `__init__` of each package above it that the importer is not inside, so that import counts as an
import of those packages too."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 500  # lines per library module


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for package in ("harness", "kvconform"):
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _graph(modules: dict[str, Path]) -> dict[str, tuple[set[str], set[str]]]:
    """Per module, the modules of `modules` it imports at its top level, and those it imports inside functions."""
    graph = {}
    for name, path in modules.items():
        top, inner = set(), set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def targets(node: ast.AST) -> set[str]:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                module = node.module or ""
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    module = f"{base}.{module}" if module else base
                names = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
            found = {n for n in names if n in modules and n != name}
            return found | {p for n in found for p in _packages_above(n, modules)
                            if p != name and not name.startswith(p + ".")}

        def walk(node: ast.AST, inside: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    (inner if inside else top).update(targets(child))
                elif _annotations_only(child):  # never runs: names for annotations, not an import
                    for other in child.orelse:
                        walk(other, inside)
                    continue
                walk(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        walk(ast.parse(path.read_text()), False)
        graph[name] = (top, inner)
    return graph


def _annotations_only(node: ast.AST) -> bool:
    """An `if TYPE_CHECKING:` block: its imports give annotations their names and never run."""
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _packages_above(module: str, modules: dict[str, Path]) -> list[str]:
    """The packages whose `__init__` runs when `module` is imported."""
    parts = module.split(".")
    return [p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in modules]


def _reach(graph, start: str) -> set[str]:
    """Every module `start` imports at top level, transitively."""
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()][0]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def _circles(graph) -> list[str]:
    return sorted(f"{a} -> {b} -> ... -> {a}" for a in graph for b in graph[a][0] if a in _reach(graph, b))


def _climbs(graph) -> list[str]:
    """Imports inside a function of a module that imports the importer back (a package's own parts among them)."""
    return sorted(f"{a} imports {b} inside a function, and {b} imports {a}" for a in graph for b in graph[a][1]
                  if a in _reach(graph, b))


MODULES = _modules(ROOT)
GRAPH = _graph(MODULES)


def test_no_import_circle():
    assert not _circles(GRAPH)


def test_no_import_inside_a_function_climbs_back():
    assert not _climbs(GRAPH)


def _below_the_runner(graph) -> list[str]:
    """Modules outside harness.run that the runner imports and that import the runner back: what the runner stands
    on sits below it (the declarations, the outcome type); the checks' implementations (harness.checks.<name>) sit
    above it, found by their suite's name when the runner first asks (harness.run.implementation)."""
    run = [n for n in graph if n == "harness.run" or n.startswith("harness.run.")]
    below = {n for r in run for n in _reach(graph, r) if n not in run and n.startswith("harness.")}
    return sorted(f"{n} imports the runner ({', '.join(sorted(set(run) & _reach(graph, n)))})" for n in below
                  if set(run) & _reach(graph, n))


def test_nothing_the_runner_stands_on_imports_the_runner():
    assert not _below_the_runner(GRAPH)


def test_a_check_body_importing_the_runner_is_seen_and_an_annotation_only_import_is_not(tmp_path):
    (tmp_path / "harness" / "run").mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "run" / "__init__.py").write_text("")
    (tmp_path / "harness" / "run" / "loop.py").write_text("from harness import body\n")
    (tmp_path / "harness" / "run" / "trial.py").write_text("")
    (tmp_path / "harness" / "body.py").write_text("from harness.run.trial import Trial\n")
    assert _below_the_runner(_graph(_modules(tmp_path))) == [
        "harness.body imports the runner (harness.run, harness.run.trial)"]
    (tmp_path / "harness" / "body.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from harness.run.trial import Trial\n")
    assert _below_the_runner(_graph(_modules(tmp_path))) == []


def test_the_library_core_never_imports_the_plugin():
    up = sorted(f"{a} imports {b}" for a, (top, inner) in GRAPH.items() if a.startswith("harness")
                for b in top | inner if b.startswith("kvconform"))
    assert not up


def test_no_library_module_is_over_the_limit():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > LIMIT}
    assert not long


def test_a_planted_circle_and_climb_are_seen(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "a.py").write_text("from harness import b\n")
    (tmp_path / "harness" / "b.py").write_text("import harness.c\n\n\ndef f():\n    from harness import a\n")
    (tmp_path / "harness" / "c.py").write_text("from .a import x\n")
    graph = _graph(_modules(tmp_path))
    assert graph["harness.b"] == ({"harness.c"}, {"harness.a"}) and graph["harness.c"] == ({"harness.a"}, set())
    assert len(_circles(graph)) == 3 and _climbs(graph) == [
        "harness.b imports harness.a inside a function, and harness.a imports harness.b"]


def test_a_package_loading_its_own_part_that_imports_it_back_is_a_climb(tmp_path):
    (tmp_path / "harness" / "p").mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "p" / "__init__.py").write_text("def f():\n    from harness.p import part\n")
    (tmp_path / "harness" / "p" / "part.py").write_text("from harness import p\n")
    assert _climbs(_graph(_modules(tmp_path))) == [
        "harness.p imports harness.p.part inside a function, and harness.p.part imports harness.p"]


def test_a_lazy_import_that_climbs_back_through_a_package_init_is_a_climb(tmp_path):
    # harness.f imports harness.v.s inside a function; importing it runs harness/v/__init__.py, which imports harness.f.
    (tmp_path / "harness" / "v").mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "f.py").write_text("def drift():\n    from harness.v.s import diff\n")
    (tmp_path / "harness" / "v" / "__init__.py").write_text("from harness import f\n")
    (tmp_path / "harness" / "v" / "s.py").write_text("def diff():\n    pass\n")
    graph = _graph(_modules(tmp_path))
    assert graph["harness.f"] == (set(), {"harness.v.s", "harness.v"})
    assert _climbs(graph) == ["harness.f imports harness.v inside a function, and harness.v imports harness.f"]


ARCHITECTURE = ROOT / "docs" / "architecture.md"
HEAVY = ("torch", "hypothesis", "triton", "numpy")


def _wings() -> dict[str, str]:
    """docs/architecture.md's wing table: each wing (a package's folder, or a module) and what its modules need."""
    table = ARCHITECTURE.read_text().split("\n## Wings\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| `")]
    return {cells[0].strip("`"): cells[1] for cells in rows}


def _light(wing: str, needs: str) -> list[str]:
    """The modules of `wing` that its row says need none of torch, hypothesis and Triton: every one (`none`), the
    ones it names (`none (`a`, `b`), torch`), or the module itself (`none at its top`)."""
    if not needs.startswith("none"):
        return []
    named = needs.split("(", 1)[1].split(")", 1)[0] if needs.startswith("none (") else ""
    folder = ROOT / wing
    if not folder.is_dir():
        return [wing.removesuffix(".py").replace("/", ".").removesuffix(".__init__")]
    package = wing.strip("/").replace("/", ".")
    stems = [n.strip(" `") for n in named.split(",")] if named else [
        p.stem for p in sorted(folder.glob("*.py")) if p.stem != "__main__"]
    return [package if s == "__init__" else f"{package}.{s}" for s in stems]


def test_the_architecture_has_one_row_per_wing():
    harness = ROOT / "harness"
    wings = {f"harness/{p.name}/" for p in harness.iterdir() if (p / "__init__.py").is_file()}
    wings |= {f"harness/{p.name}" for p in harness.glob("*.py") if p.name != "__init__.py"}
    assert wings <= set(_wings()), sorted(wings - set(_wings()))


def test_what_the_architecture_says_needs_none_of_torch_imports_without_it():
    light = [m for wing, needs in _wings().items() for m in _light(wing, needs)]
    assert {"harness.results", "harness.matrix.workflow", "harness.recordings.api_history", "harness.checks",
            "harness.device.limits", "kvconform"} <= set(light), light
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in HEAVY)
    code = f"import importlib, sys; {blocked}\nfor m in {light!r}:\n    importlib.import_module(m)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_light_module_that_imports_torch_is_seen(tmp_path):
    (tmp_path / "heavy.py").write_text("import torch\n")
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in HEAVY)
    done = subprocess.run([sys.executable, "-c", f"import sys; {blocked}; import heavy"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode != 0 and "torch" in done.stderr


def test_each_class_name_is_defined_once():
    defined: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(name)
    assert {c: where for c, where in defined.items() if len(where) > 1} == {}


def _ignored_sources(root) -> list[str]:
    """The source files under the library, the plugin and the suites that git ignores: a clone would lack them."""
    listed = subprocess.run(["git", "ls-files", "-oi", "--exclude-standard", "--", "harness", "kvconform",
                             "conformance"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    return [p for p in listed if p.endswith(".py")]


def test_no_source_file_of_the_library_is_ignored_by_git():
    assert _ignored_sources(ROOT) == []


def test_an_ignored_source_file_is_seen(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("results/\n")
    (tmp_path / "harness" / "results").mkdir(parents=True)
    (tmp_path / "harness" / "results" / "__main__.py").write_text("")
    assert _ignored_sources(tmp_path) == ["harness/results/__main__.py"]
