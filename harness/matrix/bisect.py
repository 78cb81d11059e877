"""The first vLLM build where a chosen check turns red for a subject: `python -m harness.matrix.bisect GOOD BAD
[--commits FILE] [--index WHERE] [--package REQ] [pytest options]`, from a host project's folder with kvconform
installed there, or `nox -s bisect -- GOOD BAD ...` in a kvconform checkout.

The builds searched are matrix.toml's releases from GOOD to BAD in matrix order (`main` excluded), or with
`--commits FILE` (full commit hashes of vLLM main, oldest first, one a line, `#` comments) the commits of FILE from
GOOD to BAD, each installed from its own wheel: `<WHERE>/<commit>` is that commit's index (vLLM publishes one per
main commit at https://wheels.vllm.ai/<commit>), or a folder of its wheels where WHERE is a local directory. WHERE is
--index, else KVCONFORM_COMMIT_WHEELS, else matrix.toml's [nightly] commits.

Each build tried gets a fresh venv (on the interpreter harness.matrix chooses for it, under KVCONFORM_VENVS, else
.nox/vllm of the folder it runs in) holding it, kvconform (from where it is installed: `kvconform_requirement`) and
the package that holds the subject (--package, repeatable; default `.` where the folder holds pyproject.toml or
setup.py, other than kvconform's own checkout), runs `python -m pytest --pyargs kvconform.suites
--kvconform-release=NAME -p no:cacheprovider --hypothesis-seed=0 [pytest options]` there against the installed vLLM
(probed live: harness.run.releases; the fixed seed draws the same examples on every run unless the options name
another), and is removed. Each build's logs and result lines go to results/bisect/<build>/ of that folder. pytest's
exit status 0 is green, 1 red; anything else (an install that fails, a commit without a wheel, no tests collected, a
usage error) is no verdict: the build is skipped, saying why, and the search tries the nearest untried build in its
range instead.

`bisect` is the search alone, over candidates and a verdict callable; `verdict_of` installs and runs one build.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

from harness import matrix
from harness.matrix import build

ROOT = Path(__file__).resolve().parents[2]  # the checkout, or the site-packages kvconform is installed in
SEED = 0  # --hypothesis-seed of every build's run unless its pytest options name one
GREEN, RED, SKIPPED = "green", "red", "skipped"
# pytest's exit statuses other than 0 (all passed) and 1 (some failed): none of them is a verdict on the build.
_PYTEST_EXIT = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}

C = TypeVar("C")


@dataclass(frozen=True)
class BuildVerdict:
    """What trying one build said: green, red or skipped (no verdict), why, the vLLM build installed, and seconds."""

    word: str
    why: str = ""
    build: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Bisection(Generic[C]):
    """A finished search: every build tried with its verdict in the order tried, the last green build, the earliest
    red one, and the builds between those two, all skipped, that leave open which of them is the first red."""

    tried: tuple[tuple[C, BuildVerdict], ...]
    last_green: C
    earliest_red: C
    unresolved: tuple[C, ...] = ()

    @property
    def first_red(self) -> C | None:
        """The first red build; None when skipped builds lie between the last green and the earliest red."""
        return None if self.unresolved else self.earliest_red


class EndNotAsSaid(ValueError):
    """GOOD is not green, or BAD is not red; `tried` holds the builds tried before the search stopped."""

    def __init__(self, message: str, tried: tuple[tuple[object, BuildVerdict], ...]):
        super().__init__(message)
        self.tried = tried


def bisect(candidates: Sequence[C], verdict: Callable[[C], BuildVerdict]) -> Bisection[C]:
    """The first red of `candidates` (GOOD first, BAD last, in build order), asking `verdict` of as few as a binary
    search needs: GOOD must be green and BAD red (EndNotAsSaid otherwise, GOOD asked first); a skipped build makes it
    ask the untried build nearest the middle of the range left instead."""
    if len(candidates) < 2:
        raise ValueError(f"bisecting needs a GOOD build and a later BAD one, got {len(candidates)} build(s)")
    tried: list[tuple[C, BuildVerdict]] = []

    def word(i: int) -> str:
        tried.append((candidates[i], verdict(candidates[i])))
        return tried[-1][1].word

    for i, end, want in ((0, "GOOD", GREEN), (len(candidates) - 1, "BAD", RED)):
        if word(i) != want:
            v = tried[-1][1]
            raise EndNotAsSaid(f"{end} {candidates[i]} is not {want}: {v.word}{f' ({v.why})' if v.why else ''}",
                               tuple(tried))
    green, red, skipped = 0, len(candidates) - 1, set()
    while untried := [i for i in range(green + 1, red) if i not in skipped]:
        middle = (green + red) // 2
        i = min(untried, key=lambda j: (abs(j - middle), j))
        answer = word(i)
        if answer == GREEN:
            green = i
        elif answer == RED:
            red = i
        else:
            skipped.add(i)
    return Bisection(tuple(tried), candidates[green], candidates[red],
                     tuple(candidates[i] for i in range(green + 1, red)))


@dataclass(frozen=True)
class Candidate:
    """One build to try: a matrix.toml release, or one vLLM main commit's wheel."""

    name: str  # the release, or the full commit
    release: str  # what its run names with --kvconform-release: the release, or main
    requirements: tuple[str, ...]  # the uv pip install arguments that install its vLLM (pins and index options)
    python: str  # the interpreter its venv is made from; "" where none on PATH is in its range
    python_range: str
    index: str  # where its vLLM comes from (its result lines name it: harness.matrix.build)
    per_commit: bool = False  # `index` is the commit's own, looked at for a wheel before installing

    def __str__(self) -> str:
        return self.name


def release_candidates(good: str, bad: str, found: matrix.Interpreters, path: Path = matrix.PATH
                       ) -> list[Candidate]:
    """matrix.toml's releases from `good` to `bad`, in matrix order, `main` excluded. ValueError (UnknownRelease)
    naming the release that is not listed, is main, or is out of order."""
    releases = [r for r in matrix.load(path) if not r.nightly]
    names = [r.name for r in releases]
    for end, name in (("GOOD", good), ("BAD", bad)):
        if name == "main":
            raise ValueError(f"{end} main: main is not a release to bisect over; bisect its commits with "
                             "--commits FILE")
        matrix.get(name, path)  # UnknownRelease, saying how to add it
    i, j = names.index(good), names.index(bad)
    if i >= j:
        raise ValueError(f"GOOD {good} must come before BAD {bad} in {path}'s release order")
    python = {r.name: r.interpreter(found) for r in releases[i:j + 1]}
    return [Candidate(r.name, r.name, r.requirements, python[r.name].executable if python[r.name] else "", r.python,
                      matrix.vllm_index(r)) for r in releases[i:j + 1]]


_COMMIT = re.compile(r"[0-9a-f]{40}")


def commits_listed(path: Path) -> list[str]:
    """The full commit hashes `path` lists, oldest first, one a line (`#` starts a comment). ValueError naming the
    file and line of anything else, and of a commit listed twice."""
    commits: list[str] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not _COMMIT.fullmatch(text):
            raise ValueError(f"{path}:{n}: {text!r} is not a full (40 hex digit, lower case) commit hash")
        if text in commits:
            raise ValueError(f"{path}:{n}: commit {text} is listed twice")
        commits.append(text)
    return commits


def commit_candidates(commits: Sequence[str], good: str, bad: str, wheels: str, main: matrix.Release,
                      python: matrix.Interpreter | None, listed_in: str = "the commits file") -> list[Candidate]:
    """The commits from `good` to `bad` (each a listed commit or a unique prefix of one), each installed as `main`
    from `<wheels>/<commit>`: a per-commit index, or a folder of wheels where `wheels` is a local directory."""
    local = Path(wheels).is_dir()
    if not local and "://" not in wheels:
        raise ValueError(f"per-commit wheels {wheels!r}: neither a local directory nor an index URL")
    ends = []
    for end, name in (("GOOD", good), ("BAD", bad)):
        hits = [c for c in commits if c.startswith(name.lower())] if len(name) >= 7 else []
        if len(hits) != 1:
            raise ValueError(f"{end} {name}: {'matches ' + str(len(hits)) if hits else 'is not'} a commit listed "
                             f"in {listed_in}" + ("" if len(name) >= 7 else " (give 7 or more hex digits)"))
        ends.append(commits.index(hits[0]))
    if ends[0] >= ends[1]:
        raise ValueError(f"GOOD {good} must come before BAD {bad} in {listed_in} (oldest first)")
    out = []
    for commit in commits[ends[0]:ends[1] + 1]:
        index = str(Path(wheels) / commit) if local else f"{wheels.rstrip('/')}/{commit}"
        where = ["--prerelease=allow", "--find-links" if local else "--extra-index-url", index]
        out.append(Candidate(commit, main.name, (*main.requirements, *where), python.executable if python else "",
                             main.python, index, per_commit=True))
    return out


def wheel_missing(index: str) -> str:
    """Why a commit's `index` (a folder of wheels, or an index URL) holds no vLLM wheel to install; "" when it
    does, as far as can be told without installing."""
    if "://" not in index:
        return "" if any(Path(index).glob("*.whl")) else f"no wheel: no *.whl in {index}"
    url = f"{index}/vllm/"
    try:
        with urllib.request.urlopen(url, timeout=60):
            return ""
    except urllib.error.HTTPError as e:
        return f"no wheel: {url} answers {e.code}" if e.code == 404 else f"{url} answers {e.code} {e.reason}"
    except (urllib.error.URLError, OSError) as e:
        return f"{url} could not be read: {getattr(e, 'reason', e)}"


@dataclass(frozen=True)
class Tryout:
    """How each build is tried: what is installed beside its vLLM, the pytest arguments for it (given the build and
    its folder for logs and results), where venvs, logs and the run's working directory are, and whether the run
    must say it probed the installed vLLM live (kvconform's summary line `kvconform NAME (live) ...`)."""

    install: tuple[str, ...]
    pytest_args: Callable[[Candidate, Path], Sequence[str]]
    venvs: Path
    logs: Path
    cwd: Path
    live: bool = False


# Run in the build's venv: its vLLM as harness.matrix.build reads it (this kvconform's file, loaded alone: a venv of a
# test need not hold kvconform, and the folder that holds harness may hold another vLLM), then `import vllm`, which must
# work for the run to probe it live rather than fail on it.
_BUILD = """import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("kvconform_build", {file!r})
build = sys.modules["kvconform_build"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
b = build.installed()
print("kvconform-build", json.dumps(b and [b.version, b.commit]), flush=True)
import vllm
"""


def verdict_of(c: Candidate, trial: Tryout) -> BuildVerdict:
    """Install `c` into a fresh venv (uv, its cache) with `trial.install`, run pytest there with `trial.pytest_args`,
    and remove the venv: exit status 0 green, 1 red, anything else (or anything failing before it) skipped, why
    said, the logs in `trial.logs / c.name`."""
    start = time.perf_counter()

    def verdict(word: str, why: str, installed: str = "") -> BuildVerdict:
        return BuildVerdict(word, why, installed, round(time.perf_counter() - start, 1))

    if not c.python:
        return verdict(SKIPPED, f"no python in {c.python_range} on PATH (matrix.toml's range for {c.release})")
    if c.per_commit and (missing := wheel_missing(c.index)):
        return verdict(SKIPPED, missing)
    logs = trial.logs / c.name
    logs.mkdir(parents=True, exist_ok=True)
    install_log, pytest_log = logs / "install.log", logs / "pytest.log"
    install_log.write_text("")
    pytest_log.write_text("")
    venv = trial.venvs / f"bisect-{c.name}"
    python = str(venv / "bin" / "python")
    _remove(venv)
    try:
        for what, cmd in (("uv venv", ["uv", "venv", "--python", c.python, str(venv)]),
                          ("uv pip install", ["uv", "pip", "install", "--python", python, *c.requirements,
                                              *trial.install])):
            if rc := _logged(cmd, install_log, cwd=trial.cwd):
                return verdict(SKIPPED, f"{what} failed (exit {rc}): {_last_line(install_log)}; log: {install_log}")
        done = subprocess.run([python, "-c", _BUILD.format(file=build.__file__)], check=False, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        said = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("kvconform-build ")]
        found = json.loads(said[0]) if said else None
        if not found:
            return verdict(SKIPPED, "vllm is not installed in the venv: the run would replay, not probe it live")
        installed = str(build.Build(*found))
        if done.returncode:
            return verdict(SKIPPED, f"import vllm fails: {_last(done.stderr)}", installed)
        if c.release != "main" and found[0] != c.release:
            return verdict(SKIPPED, f"the venv holds vllm {found[0]}, not {c.release}", installed)
        cmd = [python, "-m", "pytest", *trial.pytest_args(c, logs)]
        rc = _logged(cmd, pytest_log, cwd=trial.cwd, env={**os.environ, build.INDEX_ENV: c.index})
        if rc not in (0, 1):
            what = _PYTEST_EXIT.get(rc, "killed by a signal" if rc < 0 else "not pytest's")
            return verdict(SKIPPED, f"pytest exit {rc} ({what}); log: {pytest_log}", installed)
        if trial.live and f"kvconform {c.release} (live) " not in pytest_log.read_text(errors="replace"):
            return verdict(SKIPPED, f"the run did not say it probed vllm {c.release} live (no `kvconform "
                                    f"{c.release} (live)` line); log: {pytest_log}", installed)
        return verdict(GREEN if rc == 0 else RED, f"log: {pytest_log}", installed)
    finally:
        _remove(venv)


def _logged(cmd: Sequence[str], log: Path, **run: object) -> int:
    """The exit status of `cmd`, its output appended to `log` after the command line."""
    with log.open("a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              **run).returncode


def _last(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _last_line(log: Path) -> str:
    return _last(log.read_text(errors="replace"))


def _remove(path: Path) -> None:
    # rm -rf: a vLLM venv is ~9 GB of small files, which shutil.rmtree removes far slower (see the noxfile).
    subprocess.run(["rm", "-rf", str(path)], check=True)


def tried_line(c: object, v: BuildVerdict) -> str:
    """One build tried: its name, the vLLM build installed where known, the verdict, the seconds, and why."""
    why = f": {v.why}" if v.why and v.word == SKIPPED else ""
    return f"{c}{f' ({v.build})' if v.build else ''}: {v.word} in {v.seconds:.1f} s{why}"


def bisection(candidates: Sequence[Candidate], trial: Tryout) -> Bisection[Candidate] | EndNotAsSaid:
    """`bisect` over `candidates`, each build tried by `verdict_of` with `trial`, a line printed per build as it goes;
    the search's end, or why it stopped at GOOD or BAD."""

    def verdict(c: Candidate) -> BuildVerdict:
        print(f"bisect: trying {c} ...", flush=True)
        v = verdict_of(c, trial)
        print(f"bisect: {tried_line(c, v)}", flush=True)
        return v

    try:
        return bisect(candidates, verdict)
    except EndNotAsSaid as e:
        return e


def summary_lines(end: Bisection | EndNotAsSaid, seconds: float) -> list[str]:
    """The end of a search in words: the first red and last green builds (or why there is no first red), every build
    tried with its verdict, the skipped ones with why, and the wall time."""
    if isinstance(end, EndNotAsSaid):
        head = [f"bisect: stopped: {end}"]
    elif end.first_red is not None:
        log = next((v.why for c, v in end.tried if c == end.first_red and v.why), "")
        head = [f"bisect: first red: {_named(end, end.first_red)}{f'; {log}' if log else ''}",
                f"bisect: last green: {_named(end, end.last_green)}"]
    else:
        head = [(f"bisect: no first red found: the first red is one of {', '.join(map(str, end.unresolved))} "
                 f"(skipped) or {_named(end, end.earliest_red)} (red)"),
                f"bisect: last green: {_named(end, end.last_green)}"]
    lines = [*head, f"bisect: tried {len(end.tried)} build(s):"]
    lines += [f"  {tried_line(c, replace(v, why=''))}" for c, v in end.tried]
    skipped = [(c, v) for c, v in end.tried if v.word == SKIPPED]
    lines += ["bisect: skipped:", *(f"  {c}: {v.why}" for c, v in skipped)] if skipped else []
    return [*lines, f"bisect: wall time {seconds:.1f} s"]


def _named(end: Bisection, c: object) -> str:
    """`c` with the vLLM build it installed, where a verdict says."""
    installed = next((v.build for t, v in end.tried if t == c and v.build), "")
    return f"{c} ({installed})" if installed else str(c)


def parsed(argv: Sequence[str], where: Path) -> tuple[argparse.Namespace, list[str]]:
    """The command line: GOOD, BAD and bisect's own options, then the pytest options, in their order. --package
    defaults to `.` where `where` (the folder it runs in) holds a project other than kvconform's checkout."""
    ap = argparse.ArgumentParser(
        prog="python -m harness.matrix.bisect", allow_abbrev=False,  # pytest's --co must not read as --commits
        description="The first vLLM build where a check turns red for a subject; options it does not know go to "
                    "pytest (e.g. --kvconform-subject=mod:Class -k split_agrees).")
    ap.add_argument("good", metavar="GOOD", help="a green release (with --commits: a green commit of FILE)")
    ap.add_argument("bad", metavar="BAD", help="a later red release (with --commits: a later red commit of FILE)")
    ap.add_argument("--commits", type=Path, metavar="FILE",
                    help="bisect vLLM main's commits of FILE (full hashes, oldest first, one a line; # comments)")
    ap.add_argument("--index", metavar="WHERE",
                    help="with --commits: where <WHERE>/<commit> holds each commit's wheel, an index URL or a local "
                         "directory (default: KVCONFORM_COMMIT_WHEELS, else matrix.toml's [nightly] commits)")
    ap.add_argument("--package", action="append", metavar="REQ",
                    help="a requirement of the package that holds the subject, installed with its dependencies into "
                         "each build's venv (repeatable; default: . where this folder holds pyproject.toml or "
                         "setup.py, other than kvconform's checkout)")
    args, pytest_args = ap.parse_known_args(argv)
    if args.index and not args.commits:
        ap.error("--index WHERE takes effect only with --commits FILE")
    if args.package is None:
        project = any((where / f).is_file() for f in ("pyproject.toml", "setup.py"))
        args.package = ["."] if project and where.resolve() != ROOT else []
    return args, pytest_args


def kvconform_requirement() -> tuple[str, ...]:
    """The uv pip install arguments that put this kvconform into a build's venv: its checkout, editable, where it
    runs from one; else where its installation came from (direct_url.json: a folder, an archive, a VCS commit);
    else its version, from the index."""
    if (ROOT / "pyproject.toml").is_file() and (ROOT / "conformance").is_dir():
        return ("-e", str(ROOT))
    try:
        dist = importlib.metadata.distribution("kvconform")
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"{ROOT} holds harness but is neither a kvconform checkout nor kvconform's installation: "
                         "install kvconform (pip install <kvconform checkout or URL>)") from None
    came = json.loads(dist.read_text("direct_url.json") or "null")
    if not came:
        return (f"kvconform=={dist.version}",)
    url = came["url"]
    if vcs := came.get("vcs_info"):
        url = f"{vcs['vcs']}+{url}@{vcs['commit_id']}"
    if sub := came.get("subdirectory"):
        url += f"#subdirectory={sub}"
    return (f"kvconform @ {url}",)


def suites_trial(pytest_args: Sequence[str], packages: Sequence[str], where: Path) -> Tryout:
    """The trial of `python -m harness.matrix.bisect` run in folder `where`: kvconform, pytest-xdist (the suites' GPU
    workers) and `packages` beside each build's vLLM, the suites run live from `where` at the fixed seed unless
    `pytest_args` name one, each build's results and logs in `where`/results/bisect/<build>/."""
    seed = [] if any(a.startswith("--hypothesis-seed") for a in pytest_args) else [f"--hypothesis-seed={SEED}"]

    def args(c: Candidate, out: Path) -> list[str]:
        return ["--pyargs", "kvconform.suites", f"--kvconform-release={c.release}", "-p", "no:cacheprovider",
                f"--kvconform-results-dir={out}", *seed, *pytest_args]

    venvs = Path(os.environ.get("KVCONFORM_VENVS", where / ".nox" / "vllm"))
    return Tryout((*kvconform_requirement(), "pytest-xdist>=3.5", *packages), args, venvs,
                 where / "results" / "bisect", where, live=True)


def main(argv: Sequence[str]) -> int:
    """Exit status 0 when the first red build was found; 1 when the search found none (GOOD or BAD not as said,
    or skipped builds leaving it open); 2 for a command line that names no search, or no uv to install builds."""
    where = Path.cwd()
    args, pytest_args = parsed(argv, where)
    start = time.perf_counter()
    found = matrix.interpreters()
    try:
        if args.commits:
            main_release = matrix.get("main")
            candidates = commit_candidates(commits_listed(args.commits), args.good, args.bad,
                                           args.index or matrix.commit_wheels(), main_release,
                                           main_release.interpreter(found), str(args.commits))
        else:
            candidates = release_candidates(args.good, args.bad, found)
        trial = suites_trial(pytest_args, args.package, where)
    except (ValueError, OSError) as e:
        print(f"bisect: {e}", file=sys.stderr)
        return 2
    if shutil.which("uv") is None:
        print("bisect: uv is not on PATH: it makes each build's venv (`python -m pip install uv`)", file=sys.stderr)
        return 2
    first = candidates[0]
    print(f"bisect: {len(candidates)} builds from GOOD {args.good} to BAD {args.bad}: "
          f"{', '.join(map(str, candidates))}; installed beside each: {shlex.join(trial.install)}; run in {where}: "
          f"python -m pytest {shlex.join(trial.pytest_args(first, trial.logs / first.name))}", flush=True)
    end = bisection(candidates, trial)
    for line in summary_lines(end, time.perf_counter() - start):
        print(line)
    return 0 if isinstance(end, Bisection) and end.first_red is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
