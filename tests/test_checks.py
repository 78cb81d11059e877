"""Each check is declared once (harness.checks) and nothing else lists check names: the runner, the plugin, the
report, the benchmarks and the suites read the declarations."""

import ast
import re
import sys
from pathlib import Path

from harness import checks

REPO = Path(__file__).resolve().parent.parent
# Everything but the declarations, the harness's own tests and data: where a check name must not be spelled out.
SOURCES = [p for d in ("harness", "kvconform", "conformance", "benchmarks", "examples", "scripts")
           for p in (REPO / d).rglob("*.py")] + [REPO / "noxfile.py"]


def named_checks(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every declared check's name that `path` uses as a check: in a collection literal of two or
    more check names (a list of checks), compared with something named for a check (`check == "oracle"`), or passed
    as `check=` or assigned to something named for a check (`CHECK = "oracle"`). The same word meaning something else (a capability, a JSON field, a folder) is not a listing."""
    tree = ast.parse(path.read_text())
    out = []

    def names(nodes) -> list[ast.Constant]:
        return [n for n in nodes if isinstance(n, ast.Constant) and n.value in checks.BY_NAME]

    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(names(node.elts)) >= 2:
            out += names(node.elts)
        elif isinstance(node, ast.Dict) and len(names(node.keys)) >= 2:
            out += names(node.keys)
        elif isinstance(node, ast.Compare) and "check" in ast.unparse(node).lower():
            out += names([node.left, *node.comparators])
        elif isinstance(node, ast.keyword) and node.arg == "check":
            out += names([node.value])
        elif isinstance(node, ast.Assign) and any("check" in ast.unparse(t).lower() for t in node.targets):
            out += names([node.value])
    return sorted({(n.lineno, n.value) for n in out})


def test_every_check_is_declared_once():
    names = [c.name for c in checks.CHECKS]
    assert len(names) == len(set(names)), names
    source = Path(checks.__file__).read_text()
    assert all(source.count(f'Check("{n}"') == 1 for n in names)


def test_no_module_outside_the_declarations_names_a_check():
    found = {f"{p.relative_to(REPO)}:{line}": name for p in SOURCES if p != Path(checks.__file__).resolve()
             for line, name in named_checks(p)}
    assert found == {}, found


def test_the_scan_finds_a_listed_check_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('KERNEL = ("bit-identity", "oracle")\nif check == "drift":\n    pass\nroot / "contracts"\n'
                       'CAPABILITIES = ("split", "transfer")\nrecord(check="install")\nCHECK = "transfer"\n')
    assert named_checks(planted) == [(1, "bit-identity"), (1, "oracle"), (2, "drift"), (6, "install"), (7, "transfer")]


def test_every_suite_module_implements_one_declared_check():
    import kvconform.suites as suites

    modules = sorted(p.stem for p in Path(suites.__path__[0]).glob("test_*.py"))
    assert modules == sorted(c.module for c in checks.CHECKS if c.module)
    for name in modules:
        module = __import__(f"kvconform.suites.{name}", fromlist=["CHECK"])
        assert module.CHECK is checks.BY_NAME[module.CHECK.name] and module.CHECK.module == name


def test_the_declarations_name_no_other_module_not_even_as_a_string():
    # The report and nox's interpreter read harness/checks/__init__.py with the standard library alone; the strategies that
    # draw a check's examples are bound in harness.run.draws, not named here for a lazy import.
    tree = ast.parse(Path(checks.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [s for s in strings if re.match(r"(harness|kvconform|conformance)\.\w+", s)]


def test_a_view_check_draws_five_times_the_examples_up_to_its_most_never_fewer_than_a_kernel_check():
    from harness import profiles

    per = {name: values["max_examples"] for name, values in profiles.PROFILES.items()}
    view, kernel = checks.SPLIT_AGREES, checks.BIT_IDENTITY
    assert view.most == checks.REJECTS_MALFORMED.most == checks.VIEW_MOST
    # The CPU's profiles keep their draws (kill power is measured there): five times, below the bound.
    assert [view.budget(per[p]) for p in ("ci", "find", "generated", "dev")] == [40, 40, 40, 50]
    # The GPU's: the bound; a profile asking more of every check gets at least that.
    assert view.budget(per["gpu"]) == checks.VIEW_MOST and view.budget(per["nightly"]) == per["nightly"]
    assert [kernel.budget(n) for n in (8, 60, 300)] == [8, 60, 300]
    unbounded = checks.Check("t", launches="none")
    assert unbounded.budget(60) == 60 * checks.CHEAP_FACTOR
