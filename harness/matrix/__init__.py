"""The release matrix (matrix.toml at the repository root, shipped in the package as harness/matrix.toml: a link to
it in the checkout, so that an installed kvconform reads the same file).

`python -m harness.matrix --json [--default]` prints the release names as a JSON list (a CI job matrix);
`python -m harness.matrix --newest` the newest PyPI release (what CI probes live); `python -m harness.matrix
--pythons` each release's python range and the interpreter on PATH its sessions would use; `--requirements NAME` what
installs a release (one argument a line), `--index NAME` where its vLLM comes from.

Interpreters: a release's sessions run on the newest python found on PATH within its range (see `interpreters`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from harness.matrix import build

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

# The repository root's in a checkout (or a copy of one); the package's own where none lies beside harness (an
# installed kvconform).
_HARNESS = Path(__file__).resolve().parent.parent
_ROOT_FILE = _HARNESS.parent / "matrix.toml"
PATH = _ROOT_FILE if _ROOT_FILE.is_file() else _HARNESS / "matrix.toml"


@dataclass(frozen=True)
class Release:
    """One matrix entry: a vLLM version on PyPI, or `main` from the nightly index."""

    name: str
    python: str  # the range of Pythons its sessions may run on (PEP 440, e.g. ">=3.10,<3.13")
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

    @property
    def python_range(self) -> SpecifierSet:
        try:
            return python_range(self.python)
        except ValueError as e:
            raise ValueError(f"release {self.name}: {e}") from None

    def interpreter(self, found: Interpreters) -> Interpreter | None:
        """The interpreter this release's sessions run on: the newest of `found` in its range (None: none here)."""
        return found.newest(self.python_range)


def python_range(text: str) -> SpecifierSet:
    """`text` as a range of Python versions. An empty range is refused: it would admit any interpreter, also one
    the release cannot install on."""
    # Imported here rather than at the top: `python -m harness.matrix --json` runs on a bare python (CI's plan job),
    # and only choosing interpreters needs packaging (nox and kvconform both depend on it).
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        spec = None
    if spec is None or len(spec) == 0:
        raise ValueError(f"python {text!r} is not a range of Python versions, e.g. '>=3.10,<3.13'")
    return spec


@dataclass(frozen=True)
class Interpreter:
    """A python that answered: its version (PEP 440: 3.11.7, 3.14.0rc1) and the executable it reports."""

    version: str
    executable: str

    def __str__(self) -> str:
        return f"{self.version} ({self.executable})"


@dataclass(frozen=True)
class Interpreters:
    """What a search of PATH found: the interpreters that answered, newest first (equal versions in PATH order, so
    the choice is the same on every run), and the candidate files that did not answer."""

    found: tuple[Interpreter, ...]
    unanswered: tuple[str, ...] = ()

    def newest(self, spec: SpecifierSet | str) -> Interpreter | None:
        """The newest interpreter `spec` admits (pre-releases only where `spec` names one), or None."""
        spec = python_range(spec) if isinstance(spec, str) else spec
        return next((i for i in self.found if spec.contains(i.version)), None)

    def describe(self) -> str:
        """The search's result in words, for errors that say why no interpreter fits."""
        found = ", ".join(map(str, self.found)) or "none"
        silent = ", ".join(self.unanswered)
        silent = f"; on PATH but not answering (pyenv shims of versions not selected?): {silent}" if silent else ""
        return f"interpreters found on PATH: {found}{silent}"


_CANDIDATE = re.compile(r"python3(?:\.(\d+))?")
# sys.version_info's five fields ("3 11 7 final 0"), then sys.executable: the real interpreter behind a shim or link,
# which the venv is made from (a shim answers only while its version stays selected).
_ASK = "import sys; print(*sys.version_info[:5]); print(sys.executable)"
_LEVELS = {"alpha": "a", "beta": "b", "candidate": "rc"}


def interpreters(path: str | None = None) -> Interpreters:
    """Every `python3` and `python3.N` on `path` (default: $PATH) that answers when asked for its version.

    Every directory counts, not only the first file of a name that a shell would run: a pyenv shim of a version not
    selected through PYENV_VERSION fails, and must not hide a working python3.12 later on PATH. Files that fail or
    hang are kept as `unanswered`, for errors; an interpreter reached under several names counts once. The result is
    cached per path: the noxfile asks for every release's interpreter each time it loads."""
    return _interpreters(os.environ.get("PATH", "") if path is None else path)


@functools.cache
def _interpreters(path: str) -> Interpreters:
    from packaging.version import Version

    files, seen = [], set()
    for folder in filter(None, path.split(os.pathsep)):
        try:
            names = [n for n in os.listdir(folder) if _CANDIDATE.fullmatch(n)]
        except OSError:
            continue
        for name in sorted(names, key=_newest_name_first):
            file = os.path.join(folder, name)
            real = os.path.realpath(file)
            if real not in seen and os.path.isfile(file) and os.access(file, os.X_OK):
                seen.add(real)
                files.append(file)
    # A pyenv shim takes ~0.3 s to answer and a PATH holds a dozen: ask them at once.
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(_ask, files))
    found, unanswered, executables = [], [], set()
    for file, answer in zip(files, answers):
        if answer is None:
            unanswered.append(file)
        elif os.path.realpath(answer.executable) not in executables:
            executables.add(os.path.realpath(answer.executable))
            found.append(answer)
    found.sort(key=lambda i: Version(i.version), reverse=True)  # stable: equal versions stay in PATH order
    return Interpreters(tuple(found), tuple(unanswered))


def _newest_name_first(name: str) -> tuple[int, str]:
    minor = _CANDIDATE.fullmatch(name).group(1)
    return (-int(minor) if minor else 1, name)


def _ask(file: str) -> Interpreter | None:
    try:
        done = subprocess.run([file, "-I", "-c", _ASK], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) < 2:
        return None
    try:
        major, minor, micro, level, serial = lines[0].split()
        version = f"{int(major)}.{int(minor)}.{int(micro)}"
        if level != "final":
            version += f"{_LEVELS[level]}{int(serial)}"
    except (ValueError, KeyError):
        return None
    return Interpreter(version, lines[1].strip() or file)


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


VLLM = "vllm"  # the package of a connector that ships with vLLM: it runs in each vLLM release, nothing installed


@dataclass(frozen=True)
class ConnectorPackage:
    """A KV connector package run live as a subject (a `[[connector]]` entry of matrix.toml): a third party's, or
    vLLM's own (`package = "vllm"`, whose releases are the vLLM releases it runs in)."""

    subject: str  # the kvconform subject that drives it (`--kvconform-subject`)
    package: str  # its PyPI name
    releases: tuple[str, ...]  # its releases to run; none for vLLM's own
    needs: tuple[str, ...] = ()  # what its CPU path imports beyond a vLLM release's own dependencies
    tests: tuple[str, ...] = ()  # tests of its adapter that need it installed, run beside the suites
    loads: dict[str, tuple[str, ...]] = field(default_factory=dict)  # per release, the compiled modules its CPU path
    # imports (built against some torch)

    def requirements(self, release: str) -> tuple[str, ...]:
        """What `uv pip install --no-deps` adds to a vLLM release's venv to run `release` of the package."""
        return () if self.package == VLLM else (f"{self.package}=={release}", *self.needs)

    def unloadable(self, release: str, python: str) -> str | None:
        """Why one of the compiled modules of its `release` does not import with `python` (a venv holding it and a
        vLLM release's torch), naming the module and the error's last line; None where each imports."""
        for module in self.loads.get(release, ()):
            done = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
            if done.returncode:
                last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                return f"its compiled module {module} does not import against this venv's torch: {last}"
        return None


def connectors(path: Path = PATH) -> list[ConnectorPackage]:
    """matrix.toml's connector packages; ValueError naming the file and the entry for a field missing or unknown."""
    fields, optional = ("subject", "package", "releases"), ("needs", "tests")
    out = []
    for entry in _data(path).get("connector", []):
        own = entry.get("package") == VLLM
        wanted = [f for f in fields if not (own and f == "releases")]
        problems = [f"lacks {f}" for f in wanted if f not in entry]
        problems += [f"has unknown field {f}" for f in sorted(set(entry) - {*fields, *optional, "loads"})]
        problems += [f"loads names {x}, not among its releases" for x in entry.get("loads", {})
                     if x not in entry.get("releases", ())]
        problems += ["names no release"] if entry.get("releases") == [] and not own else []
        problems += [f"names releases of package {VLLM!r}, whose releases are the vLLM releases it runs in"] \
            if own and "releases" in entry else []
        if problems:
            raise ValueError(f"{path}: connector entry {entry}: {'; '.join(problems)}")
        out.append(ConnectorPackage(entry["subject"], entry["package"], tuple(entry.get("releases", ())),
                                    *(tuple(entry.get(f, ())) for f in optional),
                                    {x: tuple(ms) for x, ms in entry.get("loads", {}).items()}))
    return out


def default(path: Path = PATH) -> list[Release]:
    return [r for r in load(path) if r.default]


class UnknownRelease(ValueError):
    """A release matrix.toml does not list."""


def get(name: str, path: Path = PATH) -> Release:
    """The release named `name`; UnknownRelease (saying how to add it) when matrix.toml does not list it."""
    for r in load(path):
        if r.name == name:
            return r
    raise UnknownRelease(f"vllm {name} is not in {path}: add a [[release]] entry for it (name, python, torch, era, "
                         f"default; the file's header says what each means), then `nox -s probe -- {name}`")


def nightly_index(path: Path = PATH) -> str:
    """Where `main` comes from: KVCONFORM_NIGHTLY_INDEX, else matrix.toml's [nightly] index."""
    return os.environ.get("KVCONFORM_NIGHTLY_INDEX") or _data(path)["nightly"]["index"]


def commit_wheels(path: Path = PATH) -> str:
    """Where vLLM main's per-commit wheels are (`<it>/<full commit>` is one commit's index, or folder of wheels):
    KVCONFORM_COMMIT_WHEELS, else matrix.toml's [nightly] commits."""
    return os.environ.get("KVCONFORM_COMMIT_WHEELS") or _data(path)["nightly"]["commits"]


def vllm_index(r: Release) -> str:
    """Where release `r`'s vLLM is installed from: the nightly index for main, else uv's default index (the index
    its result lines name, harness.matrix.build)."""
    return build.index_of(nightly_index() if r.nightly else None)


def index_args(r: Release) -> list[str]:
    """The uv pip install options release `r` needs beyond its requirements: the nightly index's for main."""
    return install_args(nightly_index()) if r.nightly else []


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
    what.add_argument("--pythons", action="store_true", help="print each release's python range and interpreter")
    what.add_argument("--requirements", metavar="NAME",
                      help="print what `uv pip install` needs for release NAME, one argument a line: its requirements "
                           "(vLLM and pins; main adds its nightly index options)")
    what.add_argument("--index", metavar="NAME", help="print where release NAME's vLLM is installed from (the "
                                                      "index its result lines name: harness.matrix.build)")
    ap.add_argument("--default", action="store_true", help="with --json: only the default subset")
    args = ap.parse_args(argv)
    try:
        if args.newest:
            print([r.name for r in load() if not r.nightly][-1])
        elif args.pythons:
            found = interpreters()
            for r in load():
                print(f"{r.name}: python {r.python} -> {r.interpreter(found) or 'none'}")
            print(found.describe())
        elif args.requirements or args.index:
            try:
                release = get(args.requirements or args.index)
            except UnknownRelease as e:
                ap.error(str(e))
            print(*([vllm_index(release)] if args.index else [*release.requirements, *index_args(release)]),
                  sep="\n")
        else:
            print(json.dumps([r.name for r in (default() if args.default else load())]))
    except (OSError, ValueError) as e:  # matrix.toml missing or malformed: one line naming it, no traceback
        print(f"python -m harness.matrix: {e}", file=sys.stderr)
        return 2
    return 0

