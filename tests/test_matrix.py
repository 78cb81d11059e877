"""matrix.toml loading, each release's python range and the interpreter chosen for it, the CI job-matrix command, and
`main` taken from a local stand-in for the nightly index."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from envs import fake_vllm_wheel

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


def test_a_connector_entry_lacking_a_field_or_with_one_unknown_is_rejected_naming_it(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[[connector]]\nsubject = "lmcache-mp"\npackage = "lmcache"\nversions = ["0.5.6"]\n')
    with pytest.raises(ValueError, match=f"{re.escape(str(p))}: connector entry .*lacks releases; has unknown field "
                                         "versions"):
        matrix.connectors(p)
    p.write_text('[[connector]]\nsubject = "lmcache-mp"\npackage = "lmcache"\nreleases = []\n')
    with pytest.raises(ValueError, match="names no release"):
        matrix.connectors(p)
    # vLLM's own connector runs in the vLLM releases named: releases of its own are refused, none are needed
    p.write_text('[[connector]]\nsubject = "vllm-example"\npackage = "vllm"\nreleases = ["0.33.0"]\n')
    with pytest.raises(ValueError, match="names releases of package 'vllm', whose releases are the vLLM releases"):
        matrix.connectors(p)
    p.write_text('[[connector]]\nsubject = "vllm-example"\npackage = "vllm"\n')
    assert matrix.connectors(p)[0].releases == ()


def test_each_connector_is_driven_by_a_known_subject_and_its_tests_exist():
    from kvconform import subjects

    assert matrix.connectors()
    for c in matrix.connectors():
        assert subjects.spec(c.subject) and (c.releases or c.package == matrix.VLLM)
        assert all((REPO / t).is_file() for t in c.tests), c.tests
        if c.package == matrix.VLLM:
            assert c.requirements("0.33.0") == ()  # it ships with the release
        else:
            assert c.requirements(c.releases[0])[0] == f"{c.package}=={c.releases[0]}"


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


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is the installer the nox sessions use")
def test_main_installs_from_a_local_directory_standing_in_for_the_nightly_index(tmp_path, monkeypatch):
    wheels = tmp_path / "nightly"
    wheels.mkdir()
    fake_vllm_wheel(wheels, "99.0.0.dev20261129")
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


def test_every_release_names_a_python_range_from_its_requires_python():
    releases = {r.name: r.python_range for r in matrix.load()}
    assert all("3.11" in spec for spec in releases.values()), "every release accepts 3.11 (matrix.toml says so)"
    assert "3.12.1" in releases["0.8.5.post1"] and "3.13.0" not in releases["0.8.5.post1"]
    assert "3.13.0" in releases["0.19.1"] and "3.14.0" not in releases["0.19.1"]
    assert "3.10.13" not in releases["0.33.0"] and "3.14.2" in releases["0.33.0"]
    assert releases["main"] == releases["0.33.0"]


@pytest.mark.parametrize("text", ["3.12", "", "python3.12", ">=3.10;<3.13"])
def test_a_python_that_is_not_a_range_is_refused_naming_the_release(text):
    r = matrix.Release("0.9.2", text, "2.7.0", "era_stride", False)
    with pytest.raises(ValueError, match=rf"release 0\.9\.2: python '{re.escape(text)}' is not a range"):
        r.interpreter(matrix.Interpreters(()))


def fake_python(folder: Path, name: str, version: str = "", executable: str = "") -> Path:
    """An executable `name` in `folder` that answers the interpreter question as a python of `version` would
    (`version` like "3.12.4" or "3.14.0 candidate 1"), reporting `executable` (default: itself) as sys.executable;
    without a version it fails as a pyenv shim of an unselected version does."""
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / name
    if version:
        major, minor, micro, *level = version.replace(".", " ").split()
        info = f"{major} {minor} {micro} {' '.join(level) if level else 'final 0'}"
        file.write_text(f"#!/bin/sh\necho '{info}'\necho '{executable or file}'\n")
    else:
        file.write_text(f"#!/bin/sh\necho 'pyenv: {name}: command not found' >&2\nexit 127\n")
    file.chmod(0o755)
    return file


def test_interpreters_are_the_pythons_on_path_that_answer_newest_first(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shim = fake_python(a, "python3.12")
    p311 = fake_python(a, "python3.11", "3.11.7")
    fake_python(a, "python3", "3.11.7", executable=str(p311))  # the same interpreter under another name
    p312 = fake_python(b, "python3.12", "3.12.4")  # a working 3.12 behind the failing shim
    p310 = fake_python(b, "python3.10", "3.10.13")
    fake_python(b, "python3.14", "3.14.0 candidate 1")
    fake_python(b, "python3.13t", "3.13.1")  # not a name looked for
    (b / "python3.9").write_text("not executable")
    found = matrix.interpreters(os.pathsep.join([str(a), str(tmp_path / "missing"), str(b)]))
    assert [(i.version, i.executable) for i in found.found] == [
        ("3.14.0rc1", str(b / "python3.14")), ("3.12.4", str(p312)), ("3.11.7", str(p311)), ("3.10.13", str(p310))]
    assert found.unanswered == (str(shim),)
    assert found.newest(">=3.10,<3.13").executable == str(p312)
    assert found.newest("<3.12").executable == str(p311)
    assert found.newest(">=3.14") is None, "a pre-release only for a range that names one"
    assert found.newest(">=3.14.0rc1").version == "3.14.0rc1"
    assert found.newest(">=3.15") is None
    text = found.describe()
    assert "3.12.4 (" in text and str(shim) in text and "not answering" in text


def test_equal_versions_are_chosen_in_path_order(tmp_path):
    first = fake_python(tmp_path / "first", "python3.12", "3.12.4")
    fake_python(tmp_path / "second", "python3.12", "3.12.4")
    path = os.pathsep.join([str(tmp_path / "first"), str(tmp_path / "second")])
    assert [matrix.interpreters(path).newest(">=3.10").executable for _ in range(3)] == [str(first)] * 3
    assert len(matrix.interpreters(path).found) == 2


def test_a_release_runs_on_the_newest_python_in_its_range_or_none(tmp_path):
    for name, version in [("python3.10", "3.10.13"), ("python3.12", "3.12.4"), ("python3.13", "3.13.1")]:
        fake_python(tmp_path, name, version)
    found = matrix.interpreters(str(tmp_path))
    pick = {r.name: r.interpreter(found) for r in matrix.load()}
    assert pick["0.8.5.post1"].version == "3.12.4"  # < 3.13
    assert pick["0.11.2"].version == pick["0.33.0"].version == "3.13.1"
    assert matrix.interpreters("").newest(">=3.10") is None
    none = matrix.Release("0.33.0", ">=3.14", "2.14.0", "era_enum", True)
    assert none.interpreter(found) is None


def test_pythons_command_prints_each_release_s_choice(tmp_path):
    fake_python(tmp_path, "python3.11", "3.11.7")
    out = subprocess.run([sys.executable, "-m", "harness.matrix", "--pythons"], cwd=REPO, capture_output=True,
                         text=True, check=True, env={**os.environ, "PATH": str(tmp_path)}).stdout
    assert f"0.33.0: python >=3.11,<3.15 -> 3.11.7 ({tmp_path / 'python3.11'})" in out.splitlines()


def test_a_matrix_it_cannot_read_is_one_line_naming_it(monkeypatch, capsys):
    def missing(name, path=matrix.PATH):
        raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr(matrix, "get", missing)
    assert matrix.main(["--requirements", "0.25.1"]) == 2
    out = capsys.readouterr()
    assert not out.out and out.err == (f"python -m harness.matrix: [Errno 2] No such file or directory: "
                                       f"'{matrix.PATH}'\n"), out.err


def test_a_connector_release_whose_compiled_module_does_not_import_says_which_and_why(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[[connector]]\nsubject = "lmcache-mp"\npackage = "lmcache"\nreleases = ["0.5.6"]\n'
                 'loads = { "0.5.6" = ["math", "kvconform_no_such_native"] }\n')
    (c,) = matrix.connectors(p)
    assert c.unloadable("0.5.6", sys.executable) == (
        "its compiled module kvconform_no_such_native does not import against this venv's torch: "
        "ModuleNotFoundError: No module named 'kvconform_no_such_native'")
    assert c.unloadable("0.4.7", sys.executable) is None  # no compiled module named for that release
    p.write_text('[[connector]]\nsubject = "lmcache-mp"\npackage = "lmcache"\nreleases = ["0.5.6"]\n'
                 'loads = { "0.4.7" = ["math"] }\n')
    with pytest.raises(ValueError, match="loads names 0.4.7, not among its releases"):
        matrix.connectors(p)
