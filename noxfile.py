"""kvconform sessions (uv backend; all sessions share uv's wheel cache unless noted).

    nox -s tests                                  harness unit tests (CPU)
    nox -s conformance                            matrix.toml's default subset: one session per release
    nox -s "conformance(release='0.9.2')" -- -x   any release of matrix.toml; pytest options after --
    nox -t matrix                                 every release of matrix.toml (not main), one session each
    nox -s replay                                 conformance suites over every recorded fixture, no vLLM (CPU CI)
    nox -s probe -- 0.32.0 0.33.0 [--check]       record (or check for drift) contracts of chosen releases
    nox -s nightly                                vLLM main from matrix.toml's [nightly] index (or KVCONFORM_NIGHTLY_INDEX)
    nox -s connectors -- 0.33.0                   matrix.toml's connector packages live (`lmcache==0.5.6`: one release)
    nox -s report                                 fold results/ into report.md, .html, .json (installs nothing)
    nox -s bisect -- GOOD BAD [--commits FILE]    the first release (or main commit) where a check turns red
    nox -s bench                                  the performance lane: paged / dense per geometry (CUDA)
    nox -s bench_suites | mutants

Each release's session runs on the newest python on PATH in the range matrix.toml gives the release (harness.matrix
chooses it; `python -m harness.matrix --pythons` shows the choices); a release with none there fails its session as
an install-error rather than being skipped. Torch is uv's choice, steered by uv's own settings: PyPI's build by
default, UV_TORCH_BACKEND=cpu (cu128, ...) for the PyTorch index's, UV_FIND_LINKS for a folder of wheels (.ci/run
sets what this project's CI machines need).
A vLLM venv is ~9 GB: KVCONFORM_DROP_VENV=1 or the posarg --drop-venv removes a session's venv when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from harness import matrix, results  # noqa: E402
from harness.matrix import build  # noqa: E402

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
# A session's python is a path harness.matrix found; should nox still not find it, that is a failure, never a skip.
nox.options.error_on_missing_interpreters = True

RELEASES = [r for r in matrix.load() if not r.nightly]
FOUND = matrix.interpreters()


def _python(r: matrix.Release) -> str | bool:
    """The python of a release's session. Without one in its range: False, nox's session without a venv, so that the
    session still runs and records the install-error (nox would skip a session whose interpreter it lacks)."""
    found = r.interpreter(FOUND)
    return found.executable if found else False


def _no_python(r: matrix.Release) -> str:
    return f"no python in {r.python} (matrix.toml's range for vllm {r.name}); {FOUND.describe()}"


@contextlib.contextmanager
def _posargs(session: nox.Session) -> Iterator[list[str]]:
    """Posargs without --drop-venv; on exit the session's venv is removed when --drop-venv or
    KVCONFORM_DROP_VENV=1 asked for it."""
    args = [a for a in session.posargs if a != "--drop-venv"]
    try:
        yield args
    finally:
        location = getattr(session.virtualenv, "location", None)
        drop = len(args) != len(session.posargs) or os.environ.get("KVCONFORM_DROP_VENV") == "1"
        if drop and location and Path(location).is_dir():
            session.log(f"removing {location}")
            _remove(session, Path(location))


@nox.session
def tests(session: nox.Session) -> None:
    """The harness's own unit tests (CPU)."""
    with _posargs(session) as args:
        session.install("-e", ".[test,modelopt]")
        session.run("pytest", "tests", "-n", "2", *args)


def _install_error(release: str, detail: str) -> None:
    """Record the release's install-error in results/, in the results format the report reads."""
    results.main(["install-error", release, detail, "--dir", str(ROOT / "results")])


def _install_vllm(session: nox.Session, release: matrix.Release, *extra: str) -> None:
    """vLLM (bringing its own CUDA torch) plus kvconform; a failure is the release's install-error."""
    try:
        session.install(*extra, *release.requirements, "-e", ".[test]")
    except nox.command.CommandFailed:
        _install_error(release.name, f"uv pip install {release.requirement} failed (see the nox log)")
        session.error(f"install-error: vllm {release.name} could not be installed")


def _conformance(session: nox.Session, release: matrix.Release, *extra: str) -> None:
    if session.python is False:
        _install_error(release.name, _no_python(release))
        session.error(f"install-error: vllm {release.name}: {_no_python(release)}")
    session.log(f"vllm {release.name} on {session.python} (matrix.toml's range: python {release.python})")
    with _posargs(session) as args:
        _install_vllm(session, release, *extra)
        junit = ROOT / "results" / release.name / "junit.xml"
        session.run("pytest", "conformance", "--kvconform-release", release.name, f"--junitxml={junit}", *args,
                    env={build.INDEX_ENV: matrix.vllm_index(release)})


@nox.session(tags=["matrix"])
@nox.parametrize(("python", "release"), [nox.param(_python(r), r.name, id=f"release={r.name!r}")
                                         for r in RELEASES if r.default])
def conformance(session: nox.Session, release: str) -> None:
    """The default subset: the newest release of each contract era."""
    _conformance(session, matrix.get(release))


@nox.session(python=_python(matrix.get("main")))
def nightly(session: nox.Session) -> None:
    """vLLM main from the nightly index: conformance, and the live probe's drift check against main.json."""
    _conformance(session, matrix.get("main"), *matrix.index_args(matrix.get("main")))


@nox.session
def replay(session: nox.Session) -> None:
    """Every recorded release's contracts through the conformance suites, without vLLM (CPU CI)."""
    # The recordings' names, read here without importing harness.recordings.store: nox's own interpreter has no torch.
    recorded = sorted((p.stem for p in (ROOT / "fixtures" / "contracts").glob("*.json")), key=matrix.version_key)
    with _posargs(session) as args:
        session.install("-e", ".[test]")
        junit = ROOT / "results" / "replay" / "junit.xml"
        session.log(f"replaying {len(recorded)} recorded releases: {', '.join(recorded)}")
        session.run("pytest", "conformance", "--kvconform-release", "recorded", "-n", "2",
                    "--hypothesis-profile=kvconform-ci", f"--junitxml={junit}", *args, env={"TRITON_INTERPRET": "1"})
        # The offloader meets every recorded cache (about 3,000 geometries): two examples per item keep CI's budget.
        session.log("and for the example offloader (examples/offloader.py), whose split and transfer checks run")
        session.run("pytest", "conformance", "--kvconform-release", "recorded", "-n", "2",
                    "--hypothesis-profile=kvconform-ci", "--kvconform-max-examples=2",
                    "--kvconform-subject=offloader:Offloader",
                    f"--kvconform-regressions-dir={ROOT / 'fixtures' / 'regressions'}",  # its committed guards
                    f"--junitxml={junit.with_name('junit-offloader.xml')}", *args,
                    env={"TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "examples")})
        session.log("and for the example block mover (examples/block_mover.py), whose model-transfer check runs")
        session.run("pytest", "conformance/test_model_transfer.py", "--kvconform-release", "recorded", "-n", "2",
                    "--hypothesis-profile=kvconform-ci", "--kvconform-subject=block_mover:BlockMover",
                    f"--junitxml={junit.with_name('junit-connector.xml')}", *args,
                    env={"PYTHONPATH": str(ROOT / "examples")})


@nox.session(venv_backend="none")
def probe(session: nox.Session) -> None:
    """Probe the releases named in posargs: record their contracts, or --check them for drift.

    Per release: install it cold (fresh venv, empty uv cache of its own) and again warm (fresh venv, that cache),
    print both times, run `python -m harness.probe` in it, then remove the venv and the cache. Install and probe
    failures are reported per release; the others still run."""
    names = [a for a in session.posargs if not a.startswith("-")]
    check = "--check" in session.posargs
    if not names:
        session.error("name releases to probe, e.g. `nox -s probe -- 0.33.0` (matrix.toml lists them)")
    _listed(session, names)
    base = Path(os.environ.get("KVCONFORM_VENVS", ROOT / ".nox" / "vllm"))
    failures, times = [], []
    for name in names:
        r = matrix.get(name)
        python = r.interpreter(FOUND)
        if python is None:
            _install_error(name, _no_python(r))
            session.warn(f"install-error: vllm {name}: {_no_python(r)}")
            failures.append(f"{name} (install-error: no python in {r.python})")
            continue
        venv, cache = base / f"probe-{name}", base / f"cache-{name}"
        extra = matrix.index_args(r)
        try:
            _remove(session, cache)
            cold = _timed_install(session, r, python, venv, cache, extra)
            warm = _timed_install(session, r, python, venv, cache, extra)
            times.append(f"vllm {name}: install cold {cold:.1f} s, warm {warm:.1f} s on python {python.version}")
            session.log(times[-1])
            facts = {"cold_s": round(cold, 1), "warm_s": round(warm, 1), "python": python.version,
                     "pins": list(r.pins)}
            cmd = [str(venv / "bin" / "python"), "-m", "harness.probe", "--release", name, "--install", json.dumps(facts)]
            session.run(*cmd, *(["--check"] if check else []),
                        env={"PYTHONPATH": str(ROOT), build.INDEX_ENV: matrix.vllm_index(r)})
        except nox.command.CommandFailed as e:
            failures.append(f"{name} ({e.reason or 'failed'})")
        finally:
            _remove(session, venv, cache)
    for line in times:
        print(line)
    if failures:
        session.error(f"probe failed for: {', '.join(failures)}")


@nox.session(venv_backend="none")
def api(session: nox.Session) -> None:
    """The recorded layout API against the releases named in posargs: per release, a venv holding it runs
    tests/test_vllm_api_live.py (the stand-ins' surface and answers equal vLLM's own over drawn arguments), then is
    removed. Posargs after `--` go to pytest."""
    names, args = _split_posargs(session.posargs)
    if not names:
        session.error("name releases, e.g. `nox -s api -- 0.25.1 0.33.0` (matrix.toml lists them)")
    _listed(session, names)

    def run(r: matrix.Release, python: str) -> list[str]:
        session.log(f"vllm {r.name}: the stand-ins built from fixtures/contracts/{r.name}.json against the release")
        session.run(python, "-m", "pytest", str(ROOT / "tests" / "test_vllm_api_live.py"), "-q", "-p",
                    "no:cacheprovider", *args, external=True)
        return []

    failures = _in_release_venvs(session, names, "api", run)
    if failures:
        session.error(f"the recorded layout API differs from or could not be checked against: {', '.join(failures)}")


@nox.session(venv_backend="none")
def connectors(session: nox.Session) -> None:
    """matrix.toml's connector packages live, over the vLLM releases named in posargs (`package==X` there: only that
    release of a package). Per vLLM release: one venv holding it and kvconform; per package release: it (and what its
    CPU path needs) installed there with --no-deps (vLLM's own connectors: nothing, X the vLLM release), its compiled
    modules imported (one that does not import against the venv's torch: an install-error line), then the connector
    suite and the adapter's tests run with it as the subject, results in results/connectors/<package>-<X>/
    (vLLM's own: results/connectors/vllm/; an install-error line where it does not install). The venv is removed
    after. Posargs after `--` go to pytest (`-k kernel-split`: one model). `nox -s report` tabulates the results."""
    names, args = _split_posargs(session.posargs)
    chosen = {a.partition("==")[0]: a.partition("==")[2] for a in names if "==" in a}
    names = [a for a in names if "==" not in a]
    if not names:
        session.error("name vLLM releases, e.g. `nox -s connectors -- 0.33.0 lmcache==0.5.6` (matrix.toml lists "
                      "the releases and the connector packages)")
    _listed(session, names)
    runs = [(c, x) for c in matrix.connectors() for x in c.releases or [None] if chosen.get(c.package, x) == x]
    unknown = sorted(f"{p}=={x}" for p, x in chosen.items() if not any(c.package == p and v == x for c, v in runs))
    if unknown:
        session.error(f"not in matrix.toml's [[connector]] entries: {', '.join(unknown)}")

    def run(r: matrix.Release, python: str) -> list[str]:
        failures = []
        for c, given in runs:
            x = given or r.name  # vLLM's own connector: the release it ships with
            cell = f"{c.package} {x} on vllm {r.name}"
            out = ROOT / "results" / "connectors" / (f"{c.package}-{x}" if given else c.package)
            try:
                if c.requirements(x):
                    session.run("uv", "pip", "install", "-q", "--python", python, "--no-deps", *c.requirements(x),
                                external=True)
                why = c.unloadable(x, python)
            except nox.command.CommandFailed:
                why = f"uv pip install --no-deps {' '.join(c.requirements(x))} failed (see the nox log)"
            if why:
                results.main(["install-error", r.name, f"{c.package} {x}: {why}", "--dir", str(out)])
                failures.append(f"{cell} (install-error: {why})")
                continue
            session.log(f"{cell}: the connector suite with {c.subject} as the subject")
            try:
                session.run(python, "-m", "pytest", "conformance/test_model_transfer.py", *c.tests,
                            "-p", "no:cacheprovider", f"--kvconform-subject={c.subject}",
                            f"--kvconform-results-dir={out}", f"--junitxml={out / r.name / 'junit.xml'}", *args,
                            external=True, env={build.INDEX_ENV: matrix.vllm_index(r)})
            except nox.command.CommandFailed as e:
                failures.append(f"{cell} ({e.reason or 'failed'})")
        return failures

    failures = _in_release_venvs(session, names, "connectors", run)
    if failures:
        session.error(f"connectors: {'; '.join(failures)}")


def _in_release_venvs(session: nox.Session, names: list[str], kind: str,
                      run: Callable[[matrix.Release, str], list[str]]) -> list[str]:
    """`run(release, its python)` for each release named, in a fresh venv `<kind>-<release>` holding it and kvconform
    (with its test extra), removed after; what failed, a line each: a release without a python, an install or a
    command `run` let fail, and what `run` returns (what failed that it went on past)."""
    base = Path(os.environ.get("KVCONFORM_VENVS", ROOT / ".nox" / "vllm"))
    failures = []
    for name in names:
        r = matrix.get(name)
        python = r.interpreter(FOUND)
        if python is None:
            failures.append(f"vllm {name} ({_no_python(r)})")
            continue
        venv = base / f"{kind}-{name}"
        try:
            _timed_install(session, r, python, venv, None, [*matrix.index_args(r), "-e", f"{ROOT}[test]"])
            failures += run(r, str(venv / "bin" / "python"))
        except nox.command.CommandFailed as e:
            failures.append(f"vllm {name} ({e.reason or 'failed'})")
        finally:
            _remove(session, venv)
    return failures


def _listed(session: nox.Session, names: list[str]) -> None:
    """One line, before anything is installed, for a release matrix.toml does not list."""
    for name in names:
        try:
            matrix.get(name)
        except matrix.UnknownRelease as e:
            session.error(str(e))


def _split_posargs(posargs: list[str]) -> tuple[list[str], list[str]]:
    """Release names, then what follows `--` (for pytest)."""
    if "--" in posargs:
        i = posargs.index("--")
        return list(posargs[:i]), list(posargs[i + 1:])
    return list(posargs), []


def _remove(session: nox.Session, *paths: Path) -> None:
    # rm -rf: one release's venv + uv cache is ~9 GB of small files (~1.5 min here; shutil.rmtree took ~2.5 min).
    session.run("rm", "-rf", *map(str, paths), external=True, silent=True)


def _timed_install(session: nox.Session, r: matrix.Release, python: matrix.Interpreter, venv: Path,
                   cache: Path | None, extra: list[str]) -> float:
    """Seconds to make a fresh venv holding the release; `cache` is the uv cache (None: uv's own)."""
    _remove(session, venv)
    start = time.perf_counter()
    env = {"UV_CACHE_DIR": str(cache)} if cache else {}
    session.run("uv", "venv", "-q", "--python", python.executable, str(venv), env=env, external=True)
    try:
        session.run("uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *extra, *r.requirements,
                    env=env, external=True)
    except nox.command.CommandFailed:
        _install_error(r.name, f"uv pip install {r.requirement} failed in nox -s {session.name}")
        raise nox.command.CommandFailed("install-error") from None
    return time.perf_counter() - start


@nox.session(venv_backend="none")
def report(session: nox.Session) -> None:
    """Fold DIR/*/results.jsonl into DIR/report.md, report.html and report.json (`nox -s report -- [DIR] [options of
    python -m harness.report]`; DIR: results). Installs nothing: the report imports only the standard library, so
    nox's own interpreter runs it from the repository root."""
    args = list(session.posargs)
    folder = args.pop(0) if args and not args[0].startswith("-") else "results"
    session.run(sys.executable, "-m", "harness.report", folder, *args, env={"PYTHONPATH": str(ROOT)}, external=True)


@nox.session(venv_backend="none")
def bisect(session: nox.Session) -> None:
    """The first vLLM build where a check turns red for a subject (`nox -s bisect -- GOOD BAD [--commits FILE]
    [--index WHERE] [pytest options]`: harness.matrix.bisect, which a host project runs as `python -m
    harness.matrix.bisect`): a binary search over matrix.toml's releases from GOOD to BAD, or over vLLM main's
    per-commit wheels, each build tried live in a fresh venv that is removed after it."""
    # Run from the repository root (nox's working directory), which `python -m` puts on sys.path for harness: the
    # checkout is installed editable beside each build, and results go to its results/bisect/.
    session.run(sys.executable, "-m", "harness.matrix.bisect", *session.posargs, external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """The performance lane (needs CUDA; give it the GPU to itself): paged / dense per geometry of the default
    subset's releases at fixed workloads, against a noise band and the subject's known performance findings; fails
    on a new one. Posargs go to `python -m kvconform.bench` (--subject, --release, --workload)."""
    session.install("-e", ".")
    session.run("python", "-m", "kvconform.bench", *session.posargs)


@nox.session
def bench_suites(session: nox.Session) -> None:
    """Kernel examples per second of the suites on CUDA, cold and warm compile cache, one GPU and all."""
    session.install("-e", ".[test]")
    session.run("python", "benchmarks/bench_suites.py", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """The planted-bug kernels, each caught by a check."""
    session.install("-e", ".[test]")
    session.run("pytest", "tests", "-k", "mutant or catches", *session.posargs)


def _release_session(r: matrix.Release) -> None:
    """A release outside the default subset, under the name a parametrised `conformance` session would have, so that
    `nox -s "conformance(release='0.9.2')"` reaches every release while a plain `nox -s conformance` runs (and lists)
    only the default subset. Registered last, so that `nox -l` lists them after the other sessions."""

    def release_session(session: nox.Session) -> None:
        _conformance(session, r)

    release_session.__doc__ = "Outside the default subset."
    nox.session(name=f"conformance(release={r.name!r})", python=_python(r), tags=["matrix"])(release_session)


for _r in RELEASES:
    if not _r.default:
        _release_session(_r)
