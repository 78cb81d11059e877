"""matrix.toml loading, the CI job-matrix command, and `main` taken from a local stand-in for the nightly index."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness import matrix

REPO = Path(__file__).resolve().parent.parent


def test_releases_are_the_last_patch_of_every_minor_from_0_8_plus_main():
    names = [r.name for r in matrix.load()]
    assert names[0] == "0.8.5.post1" and names[-1] == "main"
    minors = [tuple(n.split(".")[:2]) for n in names[:-1]]
    assert minors == [("0", str(m)) for m in range(8, 34)]
    assert all(r.python and r.era.startswith("era_") for r in matrix.load())


def test_default_subset_is_newest_release_per_era_and_flags_agree():
    default = matrix.default()
    assert [r.name for r in default] == ["0.8.5.post1", "0.11.2", "0.22.1", "0.25.1", "0.28.0", "0.33.0"]
    assert all(isinstance(r, matrix.Release) and r.default for r in default)


def test_release_is_frozen():
    with pytest.raises(AttributeError):
        matrix.load()[0].name = "x"


def test_bad_matrix_is_rejected(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[[release]]\nname = "0.9.2"\npython = "3.12"\n')
    with pytest.raises(ValueError, match="lacks torch, era, default"):
        matrix.load(p)
    entry = 'python = "3.12"\ntorch = "x"\nera = "e"\ndefault = false\n'
    p.write_text(f'[[release]]\nname = "0.10.2"\n{entry}[[release]]\nname = "0.9.2"\n{entry}')
    with pytest.raises(ValueError, match="version order"):
        matrix.load(p)


def test_version_key_orders_numerically_with_main_last():
    names = ["main", "0.10.2", "0.9.2", "0.8.5.post1", "0.33.0"]
    assert sorted(names, key=matrix.version_key) == ["0.8.5.post1", "0.9.2", "0.10.2", "0.33.0", "main"]


@pytest.mark.parametrize("flag, expect", [([], 27), (["--default"], 6)])
def test_json_command_prints_release_names(flag, expect):
    out = subprocess.run([sys.executable, "-m", "harness.matrix", "--json", *flag], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    names = json.loads(out)
    assert len(names) == expect and all(isinstance(n, str) for n in names)


def test_newest_command_prints_the_newest_pypi_release():
    out = subprocess.run([sys.executable, "-m", "harness.matrix", "--newest"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == [r.name for r in matrix.load()][-2] == "0.33.0"


def test_nightly_index_is_one_setting(monkeypatch, tmp_path):
    monkeypatch.delenv("KVCONFORM_NIGHTLY_INDEX", raising=False)
    assert matrix.nightly_index().startswith("https://")
    assert matrix.install_args(matrix.nightly_index())[-2] == "--extra-index-url"
    monkeypatch.setenv("KVCONFORM_NIGHTLY_INDEX", str(tmp_path))
    assert matrix.install_args(matrix.nightly_index()) == ["--prerelease=allow", "--find-links", str(tmp_path)]


def _fake_wheel(where: Path, version: str) -> Path:
    dist = f"vllm-{version}.dist-info"
    whl = where / f"vllm-{version}-py3-none-any.whl"
    files = {
        "vllm/__init__.py": f'__version__ = "{version}"\n',
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: kvconform-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as z:
        for name, text in {**files, f"{dist}/RECORD": record}.items():
            z.writestr(name, text)
    return whl


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is the installer the nox sessions use")
def test_main_installs_from_a_local_directory_standing_in_for_the_nightly_index(tmp_path, monkeypatch):
    wheels = tmp_path / "nightly"
    wheels.mkdir()
    _fake_wheel(wheels, "99.0.0.dev20261129")
    monkeypatch.setenv("KVCONFORM_NIGHTLY_INDEX", str(wheels))
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = venv / "bin" / "python"
    install = ["uv", "pip", "install", "-q", "--python", str(py), "--no-index",
               *matrix.install_args(matrix.nightly_index()), matrix.get("main").requirement]
    subprocess.run(install, check=True, capture_output=True)
    got = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == "99.0.0.dev20261129"


def test_pins_travel_with_the_release_requirement():
    r = matrix.get("0.9.2")
    assert r.requirements == ("vllm==0.9.2", "transformers<4.54")
    assert matrix.get("0.33.0").requirements == ("vllm==0.33.0",)


def _nox_sessions(noxfile: Path, *select: str) -> list[dict]:
    """The sessions `nox -l --json` selects with `select` (-s NAME, -t TAG) in `noxfile`: no venv is made."""
    nox = shutil.which("nox")
    if nox is None:
        pytest.skip("nox is not on PATH (the sessions' layout is checked where nox runs the tests)")
    done = subprocess.run([nox, "-f", str(noxfile), "-l", "--json", *select], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _session(name: str) -> str:
    return f"conformance(release={name!r})"


@pytest.fixture
def noxfile_with_pythons(tmp_path):
    """The noxfile and harness beside a matrix.toml whose pythons differ per release (nox -l resolves none)."""
    shutil.copy(REPO / "noxfile.py", tmp_path)
    shutil.copytree(REPO / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    pythons = {"0.8.5.post1": "3.10", "0.9.2": "3.11", "0.33.0": "3.13", "main": "3.14"}
    text = (REPO / "matrix.toml").read_text()
    for name, python in pythons.items():
        old = f'name = "{name}"\npython = "3.12"\n'
        assert old in text, f"matrix.toml's entry for {name} no longer reads {old!r}"
        text = text.replace(old, f'name = "{name}"\npython = "{python}"\n')
    (tmp_path / "matrix.toml").write_text(text)
    return tmp_path / "noxfile.py", matrix.load(tmp_path / "matrix.toml")


def test_plain_conformance_runs_only_the_default_subset_each_on_its_python(noxfile_with_pythons):
    noxfile, releases = noxfile_with_pythons
    got = [(s["session"], s["python"]) for s in _nox_sessions(noxfile, "-s", "conformance")]
    assert got == [(_session(r.name), r.python) for r in releases if r.default]
    assert ("conformance(release='0.33.0')", "3.13") in got and ("conformance(release='0.8.5.post1')", "3.10") in got


def test_every_release_is_a_session_by_its_name_on_its_python(noxfile_with_pythons):
    noxfile, releases = noxfile_with_pythons
    every = {s["session"]: s["python"] for s in _nox_sessions(noxfile, "-t", "matrix")}
    assert every == {_session(r.name): r.python for r in releases if not r.nightly}
    # One outside the default subset, by the name the README gives (either quoting), on matrix.toml's python.
    for name in ("conformance(release='0.9.2')", 'conformance(release="0.9.2")'):
        assert [(s["session"], s["python"]) for s in _nox_sessions(noxfile, "-s", name)] == [(_session("0.9.2"), "3.11")]
    assert [s["python"] for s in _nox_sessions(noxfile, "-s", "nightly")] == ["3.14"]


def test_the_repository_noxfile_has_the_readme_sessions():
    others = ["tests", "replay", "probe", "nightly", "report", "bench", "bench_suites", "mutants"]
    got = {s["session"] for s in _nox_sessions(REPO / "noxfile.py", "-s", "conformance", *others)}
    assert got == {*others, *(_session(r.name) for r in matrix.default())}
