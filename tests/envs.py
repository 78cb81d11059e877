"""A venv that sees this interpreter's packages (torch, pytest, ...) but none installed into it yet: what the tests
that install kvconform non-editable into a throwaway environment start from."""

import contextlib
import fcntl
import os
import subprocess
import sys
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
