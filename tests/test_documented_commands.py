"""Every command the documentation tells a user to run is in tests/documented_commands.toml: where it is written,
where it runs (`installed`: a host project with kvconform installed; `nox`: a checkout, through nox; `checkout`: a
bare checkout, kvconform not installed, as the GPU lane carries it) and the test that runs it as written (`run_by`)
or checks what it can without a GPU or network (`checked_by`, saying what). One command of each class runs here as
the documentation writes it, on a fresh copy of the tree.

A documented command: in README.md and docs/*.md (fenced blocks aside), in the module docstrings of noxfile.py,
benchmarks/*.py, examples/breakages/__init__.py and the modules run with `python -m` (harness/, kvconform/), and in
the `#` comments of scripts/* (a Python script's docstring): each code span, and each line indented four spaces (in
comments two, or following `Usage...:`), a trailing backslash joining the next line, cut at a ` # ` comment or else
at three spaces; kept when its first word after NAME=value settings is pip, uv, nox, python, python3, pytest,
.ci/run or scripts/*.sh, and it is more than a bare program name. In .github/workflows/kvconform.yml: each line of a
`run:` block that calls `python -m harness...` or `python -m pytest`."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import tomllib
import yaml
from envs import fresh_copy, site_packages
from test_noxfile import _nox, _nox_sessions

from harness import matrix, results

REPO = Path(__file__).resolve().parent.parent
CATALOG = Path(__file__).resolve().parent / "documented_commands.toml"
CLASSES = {"installed", "nox", "checkout"}
LAUNCHER = re.compile(r"(?:[A-Z][A-Z0-9_]*=\S*\s+)*(?:pip|uv|nox|python3?|pytest|\.ci/run|scripts/\S+\.sh)(?:\s|$)")
NODE = re.compile(r"tests/(\w+\.py)::(\w+)")


def _cut(line: str) -> str:
    line = re.split(r"\s#\s", line, maxsplit=1)[0] if re.search(r"\s#\s", line) else re.split(r"\s{3,}", line)[0]
    return " ".join(line.split())


def _in_text(text: str) -> list[str]:
    """The commands of a markdown text or a docstring: code spans and lines indented four spaces."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]
    found += [_cut(line.strip()) for line in re.sub(r"\\\n\s*", "", text).splitlines()
              if line.startswith("    ") and not line.strip().startswith("`")]
    return [c for c in found if LAUNCHER.match(c) and (" " in c or "/" in c)]  # `python` alone names a program


def _in_comments(text: str) -> list[str]:
    lines = [line[2:] if line.startswith("# ") else line[1:] for line in text.splitlines()
             if line.startswith("#") and not line.startswith("#!")]
    return _in_text("\n".join(re.sub(r"^(Usage[^:]*:|  )\s*", "    ", line) for line in lines))


def _in_workflow(text: str) -> list[str]:
    steps = [s for job in yaml.safe_load(text)["jobs"].values() for s in job["steps"]]
    return [" ".join(line.split()) for s in steps for line in s.get("run", "").splitlines()
            if re.search(r"python -m (harness|pytest)", line)]


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def documented() -> dict[str, list[str]]:
    """Each documented command -> the files (relative to the repository) that write it."""
    found: dict[str, set[str]] = {}

    def add(path: Path, commands: list[str]) -> None:
        for c in commands:
            found.setdefault(c, set()).add(str(path.relative_to(REPO)))

    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        add(path, _in_text(path.read_text()))
    # What `python -m` runs, and where a package run so documents its command line: its __init__.
    run_as_modules = sorted({q for d in ("harness", "kvconform") for p in (REPO / d).rglob("*.py")
                             for q in ([p, p.with_name("__init__.py")] if p.name == "__main__.py" else [p])
                             if p.name == "__main__.py" or 'if __name__ == "__main__"' in p.read_text()})
    for path in [REPO / "noxfile.py", *sorted((REPO / "benchmarks").glob("*.py")),
                 REPO / "examples" / "breakages" / "__init__.py", *run_as_modules]:
        add(path, _in_text(_docstring(path)))
    for path in sorted(p for p in (REPO / "scripts").iterdir() if p.is_file()):
        text = path.read_text()
        add(path, _in_comments("".join(f"# {line}\n" for line in _docstring(path).splitlines())
                               if path.suffix == ".py" else text))
    workflow = REPO / ".github" / "workflows" / "kvconform.yml"
    add(workflow, _in_workflow(workflow.read_text()))
    return {c: sorted(files) for c, files in found.items()}


def catalog() -> list[dict]:
    return tomllib.loads(CATALOG.read_text())["command"]


def _entry(text: str) -> dict:
    [entry] = [e for e in catalog() if e["text"] == text]
    return entry


def _stanza(command: str, files: list[str]) -> str:
    return (f'[[command]]\ntext = {_toml(command)}\nin = [{", ".join(map(_toml, files))}]\n'
            'class = "installed | nox | checkout"\nrun_by = "tests/...::test_..."  # or checked_by = "... (what)"\n')


def _toml(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_every_documented_command_is_in_the_catalog():
    found, listed = documented(), {e["text"]: e for e in catalog()}
    missing = [_stanza(c, files) for c, files in found.items() if c not in listed]
    assert not missing, f"documented commands not in {CATALOG.name}; add (class, test):\n" + "\n".join(missing)
    stale = [c for c in listed if c not in found]
    assert not stale, f"{CATALOG.name} lists commands no file documents any more: {stale}"
    moved = {c: (listed[c]["in"], files) for c, files in found.items() if sorted(listed[c]["in"]) != files}
    assert not moved, f"{CATALOG.name}: `in` (listed, documented) differs: {moved}"


def test_each_catalogued_command_has_a_class_and_a_test_that_exists():
    defined: dict[str, set[str]] = {}
    for entry in catalog():
        assert entry["class"] in CLASSES, entry
        said = [entry[k] for k in ("run_by", "checked_by") if k in entry]
        assert len(said) == 1, f"{entry['text']}: give run_by or checked_by, one of them: {entry}"
        assert "checked_by" not in entry or re.search(r"\(.+\)$", entry["checked_by"]), \
            f"{entry['text']}: checked_by says in parentheses what the test checks"
        nodes = NODE.findall(said[0])
        assert nodes, f"{entry['text']}: names no test (tests/FILE.py::test_name): {said[0]}"
        for file, name in nodes:
            if file not in defined:
                tree = ast.parse((REPO / "tests" / file).read_text())
                defined[file] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            assert name in defined[file], f"{entry['text']}: tests/{file} has no {name}"
        assert "run_by" not in entry or len(nodes) == 1, f"{entry['text']}: run_by names one test: {said[0]}"


def _nox_selections(command: str) -> list[tuple[str, str]]:
    """(-s or -t, name) of each session or tag a nox command selects; `a | b` names alternatives."""
    words = shlex.split(re.sub(r"[][|]", " ", command).split(" -- ")[0].split(" && ")[-1])
    words = words[words.index("nox") + 1:]
    selected, flag = [], None
    for w in words:
        if w in ("-s", "-t"):
            flag = w
        elif flag and not w.startswith("-"):
            selected.append((flag, w))
    return selected


def test_documented_nox_commands_select_sessions_of_the_noxfile():
    wanted = {s for e in catalog() if re.search(r"(^|\s)nox\s", e["text"]) for s in _nox_selections(e["text"])}
    assert wanted, "no documented nox command selects a session"
    names = sorted(name for flag, name in wanted if flag == "-s")
    got = {s["session"] for s in _nox_sessions(REPO / "noxfile.py", "-s", *names)}
    for name in names:  # nox reads either quoting of a parametrised session's name
        assert name.replace('"', "'") in got or any(g.startswith(f"{name}(") for g in got), (name, sorted(got))
    for tag in sorted(name for flag, name in wanted if flag == "-t"):
        assert _nox_sessions(REPO / "noxfile.py", "-t", tag), tag


def _long_options(command: str) -> list[str]:
    """The long options a command gives its program (placeholders' brackets aside; none after a ` -- `)."""
    return re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", re.sub(r"[][]", " ", command).split(" -- ")[0])


def _entry_point(command: str) -> str | Path | None:
    """"pytest" for a pytest command, else the source file of a `python -m M` or `python FILE.py` command."""
    words = [w for w in shlex.split(command.replace("[", " ").replace("]", " ")) if not re.fullmatch(r"[A-Z_]+=\S*", w)]
    if words[0] == "pytest" or words[1:3] == ["-m", "pytest"]:
        return "pytest"
    if words[0] not in ("python", "python3"):
        return None
    if words[1] == "-m":
        module = REPO / words[2].replace(".", "/")
        return module / "__main__.py" if module.is_dir() else module.with_suffix(".py")
    return REPO / words[1]


# Every option string pytest's parser takes (aliases such as --junitxml included, which --help leaves out).
PRINT_OPTIONS = ("def pytest_configure(config):\n"
                 "    print('OPTIONS', *config._parser.optparser._option_string_actions)\n")


def test_documented_python_commands_use_options_their_entry_point_has(tmp_path):
    (tmp_path / "print_options.py").write_text(PRINT_OPTIONS)
    helped = subprocess.run([sys.executable, "-m", "pytest", "-p", "print_options", "--help", "-p",
                             "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert helped.returncode == 0, helped.stderr
    pytest_options = set(re.search(r"^OPTIONS (.*)$", helped.stdout, re.M).group(1).split())
    unknown = []
    for command in documented():
        inner = re.search(r"\$\((?:cd \S+ && )?([^)]*)\)", command)  # a workflow line's $(command)
        text = inner.group(1) if inner else command
        point = _entry_point(text) if LAUNCHER.match(text) else None
        if point is None:
            continue
        # A package's __main__ may take its command line from the package (harness.matrix's main).
        sources = [] if point == "pytest" else [point, point.with_name("__init__.py")] if point.name == "__main__.py" \
            else [point]
        known = pytest_options if point == "pytest" else {o for f in sources
                                                           for o in re.findall(r"--[a-z][a-z0-9-]*", f.read_text())}
        unknown += [(command, o) for o in _long_options(text) if o not in known]
    assert not unknown, f"options their program does not have: {unknown}"


def test_documented_scripts_print_their_usage_without_arguments():
    scripts = sorted({m for e in catalog() for m in re.findall(r"scripts/\w+\.sh", e["text"])})
    assert scripts
    for script in scripts:
        done = subprocess.run(["bash", script], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and f"{script} RELEASE" in done.stdout, (script, done.stdout, done.stderr)


def test_a_host_project_runs_the_readmes_breakage_command(tmp_path):
    # kvconform as this environment has it installed (its suites are kvconform.suites, no path of the project);
    # $KVCONFORM a fresh copy of the tree, for its examples; the README's line with three examples an item.
    [entry] = [e for e in catalog() if "README.md" in e["in"] and "SizeTwoAtOne" in e["text"]]
    assert entry["class"] == "installed" and entry["run_by"].endswith(sys._getframe().f_code.co_name)
    tree = fresh_copy(tmp_path / "kvconform")
    (tmp_path / "project").mkdir()
    env = {**os.environ, "KVCONFORM": str(tree),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    run = lambda command: subprocess.run(["bash", "-c", command], cwd=tmp_path / "project",  # noqa: E731
                                         capture_output=True, text=True, env=env, timeout=900)
    done = run(f"{entry['text']} --kvconform-max-examples 3 -p no:cacheprovider")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    # As the README says: split-agrees fails on the kv-first caches of 0.8.5.post1-0.22.1 and passes elsewhere.
    failed = re.findall(r"^FAILED \S+::test_split_agrees\[([^\]-]+)-([^\]]+)\]", out, re.M)
    names = [r.name for r in matrix.load()]
    assert failed and {r for r, _ in failed} <= set(names[:names.index("0.22.1") + 1]), out[-3000:]
    # (a hybrid model's attention layers of those releases get kv-first caches too: model:hybrid/layers.0)
    assert all(geometry.startswith(("kv-first", "model:hybrid/")) for _, geometry in failed), failed
    assert re.search(r"^E\s+REPRO .*--pyargs kvconform\.suites", out, re.M), out[-3000:]
    # The README's report command in the same project: one finding per failing geometry of a release, and the
    # same count after the same run again (its kept examples replayed, its generated items failing anew).
    report = _entry("python -m harness.report results")
    assert report["class"] == "installed" and report["run_by"].endswith(sys._getframe().f_code.co_name)
    verdicts = []
    for again in (False, True):
        if again:
            assert run(f"{entry['text']} --kvconform-max-examples 3 -p no:cacheprovider").returncode == 1
        folded = run(report["text"])
        assert folded.returncode == 0, folded.stdout + folded.stderr
        text = (tmp_path / "project" / "results" / "report.md").read_text()
        verdicts.append(re.search(r"\*\*((?:RED|GREEN): [^*]*)\*\*", text).group(1))
    findings = len(set(failed))
    assert verdicts[0] == verdicts[1], verdicts
    assert verdicts[0].startswith(f"RED: {findings} new finding"), (verdicts, failed)


def test_a_checkout_runs_the_report_session_through_nox(tmp_path):
    entry = _entry("nox -s report")
    assert entry["class"] == "nox"
    tree = fresh_copy(tmp_path / "tree")
    results.append(tree / "results", results.Result(run="r", release="0.25.1", source="replay", subject="builtin",
                                                    check="split-agrees", outcome="bit-identical"))
    done = _nox(tree / "noxfile.py", *shlex.split(entry["text"])[1:])
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    report = (tree / "results" / "report.md").read_text()
    assert "GREEN" in report and "0.25.1" in report, report
    assert (tree / "results" / "report.html").is_file() and (tree / "results" / "report.json").is_file()
    assert not (tree / ".nox").exists(), out  # installs nothing, as documented


def test_a_bare_checkout_runs_the_gpu_lanes_pytest_command(tmp_path):
    # scripts/gpu_live.sh's pytest line on a fresh copy run by an interpreter where kvconform is not installed:
    # -S runs no site, so neither this venv's .pth files nor its editable finder run; its site-packages on
    # PYTHONPATH gives torch, pytest and hypothesis. kvconform then imports from the checkout, which has no
    # kvconform.suites (conformance/ installs as that).
    entry = _entry("python3 -m pytest conformance --kvconform-release RELEASE -p no:cacheprovider "
                   "--kvconform-results-dir=$OUT_DIR/gpu-live [args]")
    assert entry["class"] == "checkout" and entry["in"] == ["scripts/gpu_live.sh"]
    tree = fresh_copy(tmp_path / "tree")
    python = [sys.executable, "-S"]
    env = {**os.environ, "PYTHONPATH": site_packages()}
    where = subprocess.run([*python, "-c", "import importlib.util as u, kvconform; "
                                          "print(kvconform.__file__, u.find_spec('kvconform.suites'))"],
                           cwd=tree, capture_output=True, text=True, env=env)
    assert where.stdout.split() == [str(tree / "kvconform" / "__init__.py"), "None"], where.stdout + where.stderr
    out_dir = tmp_path / "out"
    words = shlex.split(entry["text"].replace("RELEASE", "0.33.0").replace("$OUT_DIR", str(out_dir))
                        .replace(" [args]", ""))
    assert words[:3] == ["python3", "-m", "pytest"], words
    done = subprocess.run([*python, *words[1:], "-k", "split_agrees", "--kvconform-max-examples", "3"], cwd=tree,
                          capture_output=True, text=True, env=env, timeout=600)
    out = done.stdout + done.stderr
    said = "\n".join(dict.fromkeys(re.findall(r"^E .*$", out, re.M))) + out[-1500:]  # each distinct error once
    assert done.returncode == 0 and re.search(r"\d+ passed", out) and " error" not in out, said
    rows = results.read(out_dir / "gpu-live", "0.33.0")
    assert rows and {r.outcome for r in rows if r.check == "split-agrees"} >= {"bit-identical"}, rows[:3]
