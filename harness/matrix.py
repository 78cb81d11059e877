"""The release matrix (matrix.toml at the repository root).

`python -m harness.matrix --json [--default]` prints the release names as a JSON list (a CI job matrix);
`python -m harness.matrix --newest` the newest PyPI release (what CI probes live).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PATH = Path(__file__).resolve().parent.parent / "matrix.toml"


@dataclass(frozen=True)
class Release:
    """One matrix entry: a vLLM version on PyPI, or `main` from the nightly index."""

    name: str
    python: str
    torch: str
    era: str
    default: bool
    pins: tuple[str, ...] = ()  # extra requirements the release needs to import (see matrix.toml)

    @property
    def nightly(self) -> bool:
        return self.name == "main"

    @property
    def requirement(self) -> str:
        """What to ask the installer for (main: the newest pre-release on the nightly index)."""
        return "vllm" if self.nightly else f"vllm=={self.name}"

    @property
    def requirements(self) -> tuple[str, ...]:
        """The vLLM requirement plus the release's pins, as passed to the installer."""
        return (self.requirement, *self.pins)


def version_key(name: str) -> tuple:
    """Sort key: numeric version order, `main` after every release."""
    if name == "main":
        return (1,)
    return (0, tuple(int(x) if x.isdigit() else -1 for x in re.split(r"[.]|post", name) if x))


def _data(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def load(path: Path = PATH) -> list[Release]:
    fields = ("name", "python", "torch", "era", "default")
    out = []
    for entry in _data(path)["release"]:
        missing = [f for f in fields if f not in entry]
        if missing:
            raise ValueError(f"{path}: release entry {entry} lacks {', '.join(missing)}")
        out.append(Release(*(entry[f] for f in fields), pins=tuple(entry.get("pins", ()))))
    names = [r.name for r in out]
    if len(set(names)) != len(names) or names != sorted(names, key=version_key):
        raise ValueError(f"{path}: releases must be unique and in version order, got {names}")
    return out


def default(path: Path = PATH) -> list[Release]:
    return [r for r in load(path) if r.default]


def get(name: str, path: Path = PATH) -> Release:
    for r in load(path):
        if r.name == name:
            return r
    raise KeyError(f"release {name!r} is not in {path}")


def nightly_index(path: Path = PATH) -> str:
    """Where `main` comes from: KVCONFORM_NIGHTLY_INDEX, else matrix.toml's [nightly] index."""
    return os.environ.get("KVCONFORM_NIGHTLY_INDEX") or _data(path)["nightly"]["index"]


def install_args(index: str) -> list[str]:
    """uv pip install options that take `main` from `index`: a URL is an extra index (searched first), a local
    directory of wheels a find-links source (a stand-in for the nightly index); nightlies are pre-releases."""
    where = ["--find-links", index] if Path(index).is_dir() else ["--extra-index-url", index]
    return ["--prerelease=allow", *where]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.matrix")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--json", action="store_true", help="print release names as a JSON list")
    what.add_argument("--newest", action="store_true", help="print the newest PyPI release (CI probes it live)")
    ap.add_argument("--default", action="store_true", help="with --json: only the default subset")
    args = ap.parse_args(argv)
    if args.newest:
        print([r.name for r in load() if not r.nightly][-1])
    else:
        print(json.dumps([r.name for r in (default() if args.default else load())]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
