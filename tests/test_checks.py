"""Each check is declared once (harness.checks) and implemented in one place (harness/checks/<name>.py); nothing
outside harness/checks/ spells a check's name: the runner takes a Check and asks its implementation, the report
takes check names from result lines, the plugin, the benchmarks and the suites read the declarations."""

import ast
import re
import sys
from pathlib import Path

import pytest

from harness import checks

REPO = Path(__file__).resolve().parent.parent
CHECKS = REPO / "harness" / "checks"
# Everything but the checks themselves, the harness's own tests and data: where a check name must not be spelled out.
SOURCES = [p for d in ("harness", "kvconform", "conformance", "benchmarks", "examples", "scripts")
           for p in (REPO / d).rglob("*.py") if not p.is_relative_to(CHECKS)] + [REPO / "noxfile.py"]
# Check names that are also ordinary words of another meaning here: a literal of one of them names a check only
# where it is used as one (below). Every other check name is a check wherever it is spelled.
OTHER_MEANINGS = {"contracts": "the recordings' folder and JSON field", "install": "a command word, the probe's field",
                  "drift": "the probe's word", "transfer": "a capability"}


def named_checks(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every declared check's name that `path` spells: any string literal of a check name that has
    no other meaning (OTHER_MEANINGS), in any position (an argument, a value, a key); one of those words where it is
    used as a check: in a collection literal of two or more check names (a list of checks), compared with something
    named for a check (`check == "drift"`), or passed as `check=` or assigned to something named for a check
    (`CHECK = "drift"`)."""
    tree = ast.parse(path.read_text())
    out = []

    def names(nodes) -> list[ast.Constant]:
        return [n for n in nodes if isinstance(n, ast.Constant) and n.value in checks.BY_NAME]

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in checks.BY_NAME and node.value not in OTHER_MEANINGS:
            out.append(node)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(names(node.elts)) >= 2:
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


def test_no_module_outside_the_checks_names_a_check():
    found = {f"{p.relative_to(REPO)}:{line}": name for p in SOURCES for line, name in named_checks(p)}
    assert found == {}, found


def test_the_scan_finds_a_check_name_as_a_literal_an_argument_or_a_listing(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('KERNEL = ("bit-identity", "oracle")\nif check == "drift":\n    pass\nroot / "contracts"\n'
                       'CAPABILITIES = ("split", "transfer")\nrecord(check="install")\nCHECK = "transfer"\n'
                       'Failure("split-agrees", "differs")\nwhich = "relayout"\nrun("uv", "pip", "install")\n'
                       'by = {"model-transfer": 1}\n')
    assert named_checks(planted) == [(1, "bit-identity"), (1, "oracle"), (2, "drift"), (6, "install"), (7, "transfer"),
                                     (8, "split-agrees"), (9, "relayout"), (11, "model-transfer")]


# Constants of harness.checks that the runner and the report may read: the list, the pseudo-check of the runner's
# own not-applicable lines for geometries no K/V check covers, and what is not a check.
SHARED = {"CHECKS", "BY_NAME", "KV_CHECKS", "CHEAP_FACTOR", "VIEW_MOST"}


def runner_names(path: Path) -> list[tuple[int, str]]:
    """(line, constant) of each declared check that `path` takes by its constant (`checks.ORACLE`), or imports by
    name (`from harness.checks import ORACLE`, an implementation module `from harness.checks import oracle`)."""
    declared = {n for n in vars(checks) if n.isupper() and n not in SHARED}
    implemented = {c.module.removeprefix("test_") for c in checks.CHECKS if c.module}
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "checks" \
                and node.attr in declared:
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness.checks"):
            out += [(node.lineno, a.name) for a in node.names if a.name in declared | implemented]
            if node.module.removeprefix("harness.checks.") in implemented:
                out.append((node.lineno, node.module))
    return sorted(out)


RUNNER = [p for d in ("harness/run", "harness/report", "kvconform") for p in (REPO / d).rglob("*.py")]


def test_the_runner_the_report_and_the_plugin_take_no_check_by_its_constant():
    found = {f"{p.relative_to(REPO)}:{line}": name for p in RUNNER for line, name in runner_names(p)}
    assert found == {}, found


def test_the_runner_scan_sees_a_check_taken_by_its_constant(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from harness import checks\nfrom harness.checks import ORACLE, CHECKS\n"
                       "from harness.checks import oracle\nfrom harness.checks.relayout import pairs\n"
                       "if check is checks.RELAYOUT:\n    pass\nfor c in checks.CHECKS:\n    pass\n")
    assert runner_names(planted) == [(2, "ORACLE"), (3, "oracle"), (4, "harness.checks.relayout"), (5, "RELAYOUT")]


def test_every_suite_module_is_one_declared_check_implemented_under_harness_checks():
    import kvconform.suites as suites

    from harness.run import implementation

    modules = sorted(p.stem for p in Path(suites.__path__[0]).glob("test_*.py"))
    assert modules == sorted(c.module for c in checks.CHECKS if c.module)
    for name in modules:
        module = __import__(f"kvconform.suites.{name}", fromlist=["CHECK"])
        assert module.CHECK is checks.BY_NAME[module.CHECK.name] and module.CHECK.module == name
        assert implementation.of(module.CHECK).check is module.CHECK
    homes = sorted(p.stem for p in CHECKS.glob("*.py") if p.stem not in ("__init__", "outcome"))
    assert homes == sorted(c.module.removeprefix("test_") for c in checks.CHECKS if c.module)


def test_a_check_without_an_implementation_is_refused_by_name():
    from harness.run import implementation

    with pytest.raises(ValueError, match="'toy' .suite test_toy. has no implementation: harness.checks.toy"):
        implementation.of(checks.Check("toy", module="test_toy"))
    with pytest.raises(ValueError, match="'install' has no suite module"):
        implementation.of(checks.INSTALL)
    with pytest.raises(ValueError, match="not an Implementation of check 'split-agrees'"):
        implementation.of(checks.Check("split-agrees", module="test_split"))  # another object of the same name


def test_the_declarations_name_no_other_module_not_even_as_a_string():
    # The report and nox's interpreter read harness/checks/__init__.py with the standard library alone; a check's
    # implementation is found from its suite module's name (harness.run.implementation), never named here.
    tree = ast.parse(Path(checks.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [s for s in strings if re.match(r"(harness|kvconform|conformance)\.\w+", s)]


def test_a_view_check_draws_five_times_the_examples_up_to_its_most_never_fewer_than_a_kernel_check():
    from harness.draws import profiles

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
