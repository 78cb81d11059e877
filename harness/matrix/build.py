"""The vLLM build a result came from: its version, the commit the build carries (vllm/_version.py's commit_id, else a
local version's +g<hash>; short or full as carried), its wheel's file name and the index it was installed from.

The probe records the installed build in each recording (`observations.build`); a live run's lines name the installed
build, a replayed run's the recording's (a recording without one names only the version it was probed from). The
index is what the installing session says in KVCONFORM_VLLM_INDEX (uv records none). Standard library only: the
noxfile and the report import it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from dataclasses import dataclass

INDEX_ENV = "KVCONFORM_VLLM_INDEX"
PYPI = "https://pypi.org/simple"


@dataclass(frozen=True)
class Build:
    """One vLLM build: "" where it is not known."""

    version: str
    commit: str = ""
    wheel: str = ""
    index: str = ""

    def __str__(self) -> str:
        """`vllm 0.25.1 (752a3a504) vllm-0.25.1-cp38-abi3-linux_x86_64.whl from https://pypi.org/simple`"""
        return " ".join(["vllm", self.version, *([f"({self.commit})"] if self.commit else []),
                         *([self.wheel] if self.wheel else []), *([f"from {self.index}"] if self.index else [])])

    @property
    def pin(self) -> str:
        """The requirement (with its index option off PyPI) that installs this build again."""
        if not self.index or self.index == PYPI:
            return f"vllm=={self.version}"
        where = "--find-links" if "://" not in self.index else "--extra-index-url"
        return f"vllm=={self.version} {where} {self.index}"


def index_of(nightly_index: str | None) -> str:
    """Where a session's vLLM comes from: the nightly index for `main`, else uv's default index (UV_DEFAULT_INDEX,
    UV_INDEX_URL, else PyPI)."""
    return nightly_index or os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL") or PYPI


def installed() -> Build | None:
    """The installed vLLM's build (None without one), read from its distribution's files without importing it."""
    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    version = dist.version
    return Build(version, _commit(dist, version), _wheel(dist, version), os.environ.get(INDEX_ENV, ""))


def recorded(observations: dict, release: str) -> Build:
    """The build a recording was probed from: its `build`, else the version it names (`installed`, else its
    release's name)."""
    if build := observations.get("build"):
        return Build(**build)
    return Build(observations.get("installed") or release)


def _commit(dist: importlib.metadata.Distribution, version: str) -> str:
    path = dist.locate_file("vllm/_version.py")
    text = path.read_text() if path.is_file() else ""  # vcs-versioning writes it; older builds carry no commit
    if m := re.search(r"commit_id\s*=\s*['\"]g?([0-9a-f]{7,40})['\"]", text):
        return m.group(1)
    m = re.search(r"\+g([0-9a-f]{7,40})", version)
    return m.group(1) if m else ""


def _wheel(dist: importlib.metadata.Distribution, version: str) -> str:
    """The wheel's file name, from the tags its WHEEL file lists (the name a wheel of these tags has)."""
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    if not tags:
        return ""
    parts = [list(dict.fromkeys(t.split("-")[i] for t in tags)) for i in range(3)]
    return f"vllm-{version}-{'-'.join('.'.join(p) for p in parts)}.whl"
