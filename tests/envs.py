"""What tests that install into throwaway environments start from: a venv that sees this interpreter's packages
(torch, pytest, ...) but none installed into it yet, one in-tree build of the checkout at a time, and fake vLLM
wheels (a stand-in for an index)."""

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def venv_seeing_these_packages(where: Path) -> Path:
    """A venv at `where` with this interpreter's site-packages on its path, after its own; its directory. Not
    --system-site-packages: a venv made from a venv's python would see the base interpreter's packages instead."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    site = next((where / "lib").glob("python*/site-packages"))
    (site / "parent.pth").write_text("".join(f"{p}\n" for p in sys.path if p.endswith("site-packages")))
    return where


@contextlib.contextmanager
def one_build_at_a_time(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Held while a test pip-installs the checkout: pip builds it in the tree (its build/ and egg-info), and two
    builds of one tree at once (two xdist workers) break each other."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, across its workers
    with open(shared / "kvconform-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def fake_vllm_wheel(where: Path, version: str, files: dict[str, str] | None = None) -> Path:
    """A pure-Python `vllm` wheel of `version` in `where`, holding `vllm/__init__.py` (its version) and `files`
    (path in the wheel -> text)."""
    where.mkdir(parents=True, exist_ok=True)
    dist = f"vllm-{version}.dist-info"
    whl = where / f"vllm-{version}-py3-none-any.whl"
    files = {
        "vllm/__init__.py": f'__version__ = "{version}"\n',
        **(files or {}),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: kvconform-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as z:
        for name, text in {**files, f"{dist}/RECORD": record}.items():
            z.writestr(name, text)
    return whl


def fresh_copy(where: Path) -> Path:
    """The working tree's files that git tracks or would add (ignored ones aside) copied to `where`, links as
    links: what a clone of this tree would hold, without its build outputs or an install."""
    repo = Path(__file__).resolve().parent.parent
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, capture_output=True,
                            check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = repo / name, where / name
        if source.is_symlink() or source.exists():  # a tracked file deleted in the working tree is not copied
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return where


def site_packages() -> str:
    """This venv's site-packages, for PYTHONPATH under `python -S`: its packages without its .pth files, so that no
    editable kvconform's finder runs and a bare checkout imports kvconform from its folder alone."""
    return sysconfig.get_paths()["purelib"]
