"""The vLLM build a result names (harness.matrix.build): read off an installed distribution's files without importing
it, from a recording, and as the pin that installs it again."""

from __future__ import annotations

import sys

import pytest

from harness.matrix import build
from harness.matrix.build import PYPI, Build
from harness.recordings import store


def fake_vllm(where, version: str, version_py: str | None, tags=("cp38-abi3-linux_x86_64",)):
    """An installed-looking vllm distribution under `where` (a site-packages stand-in)."""
    dist = where / f"vllm-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (dist / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: false\n" + "".join(f"Tag: {t}\n" for t in tags))
    files = [f"{dist.name}/METADATA", f"{dist.name}/WHEEL"]
    if version_py is not None:
        (where / "vllm").mkdir()
        (where / "vllm" / "_version.py").write_text(version_py)
        files.append("vllm/_version.py")
    (dist / "RECORD").write_text("".join(f"{f},,\n" for f in files))


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(build.INDEX_ENV, raising=False)
    return tmp_path


def test_a_release_wheel_names_its_commit_wheel_and_the_index_the_session_said(site, monkeypatch):
    # As vcs-versioning writes vllm/_version.py in the 0.25.1 wheel on PyPI.
    fake_vllm(site, "0.25.1", "__version__ = version = '0.25.1'\n__commit_id__ = commit_id = 'g752a3a504'\n")
    monkeypatch.setenv(build.INDEX_ENV, PYPI)
    got = build.installed()
    assert got == Build("0.25.1", "752a3a504", "vllm-0.25.1-cp38-abi3-linux_x86_64.whl", PYPI)
    assert str(got) == "vllm 0.25.1 (752a3a504) vllm-0.25.1-cp38-abi3-linux_x86_64.whl from https://pypi.org/simple"
    assert got.pin == "vllm==0.25.1"


def test_a_nightly_carries_its_commit_in_its_local_version(site, monkeypatch):
    fake_vllm(site, "0.11.1rc2.dev123+g1234abcd", None,
              tags=("cp38-abi3-manylinux1_x86_64", "cp39-abi3-manylinux1_x86_64"))
    monkeypatch.setenv(build.INDEX_ENV, "https://wheels.vllm.ai/nightly")
    got = build.installed()
    assert (got.commit, got.wheel) == (
        "1234abcd", "vllm-0.11.1rc2.dev123+g1234abcd-cp38.cp39-abi3-manylinux1_x86_64.whl")
    assert got.pin == "vllm==0.11.1rc2.dev123+g1234abcd --extra-index-url https://wheels.vllm.ai/nightly"


def test_a_build_without_a_commit_or_index_says_only_what_it_carries(site):
    fake_vllm(site, "0.8.5.post1", "__version__ = version = '0.8.5.post1'\n")
    got = build.installed()
    assert (got.version, got.commit, got.index) == ("0.8.5.post1", "", "")
    assert str(got) == "vllm 0.8.5.post1 vllm-0.8.5.post1-cp38-abi3-linux_x86_64.whl"


def test_no_vllm_is_no_build(monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
    assert build.installed() is None


def test_a_recording_names_the_build_it_was_probed_from():
    assert build.recorded({"build": {"version": "0.33.0", "commit": "abc1234", "wheel": "w.whl", "index": PYPI}},
                          "0.33.0") == Build("0.33.0", "abc1234", "w.whl", PYPI)
    # Recorded before the probe kept builds: the version it was probed from, nothing guessed.
    assert build.recorded({"installed": "0.33.0"}, "main") == Build("0.33.0")
    assert build.recorded(store.load("main").observations, "main").version == "0.33.0"


def test_a_session_index_is_the_nightly_or_uvs_default(monkeypatch):
    monkeypatch.delenv("UV_DEFAULT_INDEX", raising=False)
    monkeypatch.delenv("UV_INDEX_URL", raising=False)
    assert build.index_of(None) == PYPI
    assert build.index_of("/srv/nightly") == "/srv/nightly"
    assert Build("99.0.0.dev1", index="/srv/nightly").pin == "vllm==99.0.0.dev1 --find-links /srv/nightly"
    monkeypatch.setenv("UV_INDEX_URL", "https://mirror.example/simple")
    assert build.index_of(None) == "https://mirror.example/simple"
