"""The noxfile's sessions: one per release, each on the interpreter harness.matrix chooses for it among fake pythons
on PATH, and a release without one failing as an install-error instead of being skipped (nox runs for real here, on
a copy of the noxfile; nothing is installed)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import matrix, results
from test_matrix import fake_python

REPO = Path(__file__).resolve().parent.parent


@functools.cache
def _nox_python() -> str | None:
    """A python that has nox, run as `python -m nox`: the `nox` command may be a shim (pyenv's) that needs the PATH
    these tests replace with fake interpreters. The tests' own python first, else one on PATH."""
    pythons = [sys.executable, *(i.executable for i in matrix.interpreters().found)]
    return next((p for p in pythons if subprocess.run([p, "-c", "import nox"], capture_output=True).returncode == 0),
                None)


def _nox(noxfile: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    python = _nox_python()
    assert python is not None, "no python here or on PATH has nox (kvconform's test extra installs it)"
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    env.pop("PYENV_VERSION", None)
    return subprocess.run([python, "-m", "nox", "-f", str(noxfile), *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _nox_sessions(noxfile: Path, *select: str, path: str | None = None) -> list[dict]:
    """The sessions `nox -l --json` selects with `select` (-s NAME, -t TAG) in `noxfile`: no venv is made."""
    done = _nox(noxfile, "-l", "--json", *select, path=path)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _session(name: str) -> str:
    return f"conformance(release={name!r})"


def _copy(where: Path, pythons: dict[str, str]) -> tuple[Path, list[matrix.Release]]:
    """The noxfile and harness in `where`, beside a matrix.toml whose python ranges are `pythons` where given."""
    shutil.copy(REPO / "noxfile.py", where)
    shutil.copytree(REPO / "harness", where / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    text = (REPO / "matrix.toml").read_text()
    for name, python in pythons.items():
        entry = re.compile(rf'(name = "{re.escape(name)}"\npython = )"[^"\n]*"\n')
        assert entry.search(text), f"matrix.toml's entry for {name} no longer starts with name and python"
        text = entry.sub(rf'\g<1>"{python}"\n', text)
    (where / "matrix.toml").write_text(text)
    return where / "noxfile.py", matrix.load(where / "matrix.toml")


@pytest.fixture
def fake_pythons(tmp_path) -> str:
    """A PATH of fake interpreters only: 3.10, 3.12 and 3.13, and a 3.14 that fails as an unselected pyenv shim."""
    bin = tmp_path / "bin"
    for name, version in [("python3.10", "3.10.13"), ("python3.12", "3.12.4"), ("python3.13", "3.13.1"),
                          ("python3.14", "")]:
        fake_python(bin, name, version)
    return str(bin)


@pytest.fixture
def noxfile_with_ranges(tmp_path, fake_pythons):
    """A noxfile copy whose releases' ranges pick different fake pythons; 0.11.2 (default) and 0.9.2 find none."""
    ranges = {"0.8.5.post1": ">=3.10,<3.11", "0.9.2": ">=3.14", "0.11.2": ">=3.14", "0.33.0": ">=3.11,<3.13",
              "main": ">=3.13"}
    (tmp_path / "repo").mkdir()
    noxfile, releases = _copy(tmp_path / "repo", ranges)
    return noxfile, releases, fake_pythons


def _expected(releases: list[matrix.Release], path: str) -> dict[str, str | bool]:
    found = matrix.interpreters(path)
    return {r.name: (r.interpreter(found).executable if r.interpreter(found) else False) for r in releases}


def test_plain_conformance_runs_only_the_default_subset_each_on_its_newest_python(noxfile_with_ranges):
    noxfile, releases, path = noxfile_with_ranges
    want = _expected(releases, path)
    got = [(s["session"], s["python"]) for s in _nox_sessions(noxfile, "-s", "conformance", path=path)]
    assert got == [(_session(r.name), want[r.name]) for r in releases if r.default]
    bin = Path(path)
    assert (_session("0.8.5.post1"), str(bin / "python3.10")) in got
    assert (_session("0.33.0"), str(bin / "python3.12")) in got
    assert (_session("0.22.1"), str(bin / "python3.13")) in got
    assert (_session("0.11.2"), False) in got, "no python in range: a session without a venv, not a skip"


def test_every_release_is_a_session_by_its_name_on_its_python(noxfile_with_ranges):
    noxfile, releases, path = noxfile_with_ranges
    want = _expected(releases, path)
    every = {s["session"]: s["python"] for s in _nox_sessions(noxfile, "-t", "matrix", path=path)}
    assert every == {_session(r.name): want[r.name] for r in releases if not r.nightly}
    # One outside the default subset, by the name the README gives (either quoting).
    for name in ("conformance(release='0.9.2')", 'conformance(release="0.9.2")'):
        assert [(s["session"], s["python"]) for s in _nox_sessions(noxfile, "-s", name, path=path)] == [
            (_session("0.9.2"), False)]
    assert [s["python"] for s in _nox_sessions(noxfile, "-s", "nightly", path=path)] == [str(Path(path) / "python3.13")]


def test_the_repository_noxfile_has_the_readme_sessions():
    others = ["tests", "replay", "probe", "nightly", "report", "bench", "bench_suites", "mutants"]
    got = {s["session"] for s in _nox_sessions(REPO / "noxfile.py", "-s", "conformance", *others)}
    assert got == {*others, *(_session(r.name) for r in matrix.default())}


def _install_errors(repo: Path, release: str) -> list[results.Result]:
    return [r for r in results.read(repo / "results", release) if r.outcome == "install-error"]


@pytest.mark.parametrize("session", ["conformance(release='0.11.2')", "conformance(release='0.9.2')"])
def test_a_release_without_a_python_in_range_is_an_install_error_that_fails_the_run(noxfile_with_ranges, session):
    noxfile, _, path = noxfile_with_ranges
    release = re.search(r"'(.*)'", session).group(1)
    report = noxfile.parent / "nox-report.json"
    done = _nox(noxfile, "-s", session, "--report", str(report), path=path)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "skipped" not in out, out
    [run] = json.loads(report.read_text())["sessions"]
    assert run["result"] in ("aborted", "failed"), run
    # The error names the release, its range and what was found, also the interpreter that did not answer.
    for word in (f"install-error: vllm {release}", "no python in >=3.14", "3.13.1 (", str(Path(path) / "python3.14")):
        assert word in run["reason"], run["reason"]
    [error] = _install_errors(noxfile.parent, release)
    assert (error.release, error.source, error.geometry) == (release, "install", "*")
    assert "no python in >=3.14" in error.diagnosis and "3.12.4 (" in error.diagnosis


def test_the_report_shows_the_install_error(noxfile_with_ranges):
    noxfile, _, path = noxfile_with_ranges
    assert _nox(noxfile, "-s", _session("0.11.2"), path=path).returncode != 0
    from harness.report.__main__ import main  # it reads results/<release>/results.jsonl, as `nox -s report` does

    assert main([str(noxfile.parent / "results")]) in (0, 1)
    text = (noxfile.parent / "results" / "report.md").read_text()
    assert "0.11.2" in text and "install-error" in text


def test_the_report_session_folds_the_folder_it_is_given(noxfile_with_ranges, tmp_path):
    noxfile, _, path = noxfile_with_ranges
    assert _nox(noxfile, "-s", _session("0.11.2"), path=path).returncode != 0
    elsewhere = tmp_path / "elsewhere"
    shutil.move(noxfile.parent / "results", elsewhere)
    done = _nox(noxfile, "-s", "report", "--", str(elsewhere), "--out", str(tmp_path / "folded"), path=path)
    out = done.stdout + done.stderr
    assert "unrecognized arguments" not in out, out
    text = (tmp_path / "folded" / "report.md").read_text()
    assert "0.11.2" in text and "install-error" in text, text


def test_probe_records_an_install_error_for_a_release_without_a_python(noxfile_with_ranges):
    noxfile, _, path = noxfile_with_ranges
    done = _nox(noxfile, "-s", "probe", "--", "0.11.2", path=path)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "probe failed for: 0.11.2 (install-error: no python in >=3.14)" in out, out
    assert "no python in >=3.14" in _install_errors(noxfile.parent, "0.11.2")[0].diagnosis


def test_a_python_nox_then_cannot_find_fails_the_session_rather_than_skipping_it(noxfile_with_ranges, tmp_path):
    # The fake 3.13 answers harness.matrix's question but names an executable that is gone: nox's own
    # missing-interpreter path, which without error_on_missing_interpreters skips the session and exits 0.
    noxfile, _, _ = noxfile_with_ranges
    fake_python(tmp_path / "gone-bin", "python3.13", "3.13.1", executable=str(tmp_path / "gone" / "python3.13"))
    report = noxfile.parent / "nox-report.json"
    done = _nox(noxfile, "-s", _session("0.22.1"), "--report", str(report), path=str(tmp_path / "gone-bin"))
    assert done.returncode != 0, done.stdout + done.stderr
    [run] = json.loads(report.read_text())["sessions"]
    assert run["result"] == "failed" and "not found" in run["reason"], run


def test_the_report_session_installs_nothing_and_writes_the_report(tmp_path):
    noxfile, _ = _copy(tmp_path, {})
    results.append(tmp_path / "results", results.Result(run="r", release="0.25.1", source="replay", subject="builtin",
                                                        check="split-agrees", outcome="bit-identical"))
    done = _nox(noxfile, "-s", "report")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "GREEN: no new findings in 1 release" in (tmp_path / "results" / "report.md").read_text()
    assert "install" not in out and not (tmp_path / ".nox").exists(), out  # no venv made, nothing installed


def test_connectors_refuses_what_matrix_toml_does_not_list_before_installing(noxfile_with_ranges):
    noxfile, _, path = noxfile_with_ranges
    for args, words in [((), "name vLLM releases"), (("0.33.0", "lmcache==9.9.9"), "lmcache==9.9.9"),
                        (("9.9.9",), "vllm 9.9.9 is not in")]:
        done = _nox(noxfile, "-s", "connectors", "--", *args, path=path)
        out = done.stdout + done.stderr
        assert done.returncode != 0 and words in out, out
        assert "uv pip install" not in out and not (noxfile.parent / ".nox").exists(), out


def test_connectors_fails_for_a_release_without_a_python(noxfile_with_ranges):
    noxfile, _, path = noxfile_with_ranges
    done = _nox(noxfile, "-s", "connectors", "--", "0.11.2", path=path)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "connectors: vllm 0.11.2 (no python in >=3.14" in out, out
