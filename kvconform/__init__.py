"""kvconform's pytest plugin: options, parametrisation and reporting over the library runner (harness.runner).

Installed, it registers through the `pytest11` entry point and stays inert until a run asks for kvconform (any
`--kvconform-*` option, the suites named on the command line, or a conftest that sets `KVCONFORM_SUITES = True`, as
this repository's conformance/ does):
only then does it set up the Triton environment, load the subject and the releases, and draw examples.
The suites are `kvconform.suites` (`pytest --pyargs kvconform.suites --kvconform-subject mymod:MySubject ...`).
State lives in `config.stash`.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
from pathlib import Path

import pytest

from harness import profiles

profiles.register()  # before hypothesis' own plugin reads --hypothesis-profile at configure time
SESSION = pytest.StashKey["object"]()  # harness.runner.Session of an active run
NOT_APPLICABLE = pytest.StashKey[set]()  # the checks (harness.checks) the subject lacks a capability for
RUN = pytest.StashKey[str]()  # this run's id: made by the controller, handed to its xdist workers
OPTIONS = ("release", "subject", "max_examples", "results_dir", "contracts_dir", "known_findings", "regressions_dir",
           "workers_per_gpu", "backend", "cache_dtype", "timeout")
TIMEOUTS = {"cuda": 600.0, "cpu": 3600.0}  # default seconds per item: the interpreter is ~1000x slower


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kvconform", "kvconform: sparse attention over vLLM's paged KV caches")
    g.addoption("--kvconform-release", action="append", default=[],
                help="vLLM release to check (repeatable; 'recorded' = every recorded release). Default: the "
                     "installed vLLM, probed live.")
    g.addoption("--kvconform-subject", default=None,
                help="subject under test: builtin, modelopt, mutant:<name> or module:Class (env KVCONFORM_SUBJECT; "
                     "default builtin)")
    g.addoption("--kvconform-backend", action="append", default=[],
                help="attention backend whose contracts to check, as vLLM names it (FLASH_ATTN, FLASHINFER, "
                     "TRITON_ATTN, ...; repeatable). Default: every recorded backend.")
    g.addoption("--kvconform-cache-dtype", action="append", default=[],
                help="cache dtype whose contracts to check (auto, fp8_e4m3, fp8_e5m2, fp8_per_token_head, nvfp4; "
                     "repeatable). Default: every recorded one.")
    g.addoption("--kvconform-max-examples", type=int, default=None,
                help="override the hypothesis profile's max_examples (>= 1)")
    g.addoption("--kvconform-timeout", type=float, default=None,
                help="seconds one item may run before it ends as a `timeout` (a harness limit, never a verdict); "
                     f"0: no limit. Default {TIMEOUTS['cuda']:g} on CUDA, {TIMEOUTS['cpu']:g} on the CPU")
    g.addoption("--kvconform-results-dir", default=None, help="where <release>/results.jsonl go (default: ./results)")
    g.addoption("--kvconform-contracts-dir", default=None,
                help="recorded contracts to replay (default: the ones kvconform ships)")
    g.addoption("--kvconform-known-findings", default=None,
                help="folder of known-findings files, <subject>.toml (default: the ones kvconform ships)")
    g.addoption("--kvconform-regressions-dir", default=None,
                help="where shrunk failing examples are kept and replayed from (default: ./kvconform-regressions, "
                     "or fixtures/regressions in kvconform's own checkout)")
    g.addoption("--kvconform-workers-per-gpu", type=int, default=None,
                help="on CUDA the suites run in pytest-xdist workers, this many per visible GPU, each pinned to "
                     "one GPU (env KVCONFORM_WORKERS_PER_GPU; default 8); -n overrides")


def _worker(config: pytest.Config) -> str | None:
    """This process's xdist worker id (gw0, ...), from the input xdist gives its workers; None in the controller or
    a run without xdist (an inherited PYTEST_XDIST_WORKER does not make a process a worker)."""
    return config.workerinput["workerid"] if hasattr(config, "workerinput") else None


def _asked(config: pytest.Config) -> bool:
    return any(config.getoption(f"kvconform_{o}") not in (None, []) for o in OPTIONS)


def _names_suites(arg: str) -> bool:
    path = arg.split("::")[0]
    if path == "kvconform.suites" or path.startswith("kvconform.suites."):  # --pyargs
        return True
    import importlib.util

    spec = importlib.util.find_spec("kvconform.suites")  # conformance/ (pyproject maps it)
    return spec is not None and any(Path(path).resolve().is_relative_to(Path(d).resolve())
                                    for d in spec.submodule_search_locations or ())


def _active(config: pytest.Config) -> bool:
    if config.option.help or getattr(config.option, "version", False):
        return False
    marked = any(getattr(p, "KVCONFORM_SUITES", False) for p in config.pluginmanager.get_plugins())
    return marked or _asked(config) or any(_names_suites(a) for a in config.args)


def _prepare_environment() -> None:
    # Before any kernel module is imported: Triton picks its interpreter at @triton.jit time, and xdist workers
    # and warm-up processes inherit this environment, so they all share one compile cache (across sessions too;
    # CI caches the folder) and count their compiles the same way.
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TRITON_CACHE_DIR", str(Path.home() / ".cache" / "kvconform" / "triton"))
    from harness.compiles import MANAGER  # after TRITON_INTERPRET: it imports triton

    os.environ.setdefault("TRITON_CACHE_MANAGER", MANAGER)


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config):
    # On CUDA, no -n means GPUs x workers-per-GPU workers (-n 0 keeps one process). A wrapper, so that this runs
    # before xdist's own (tryfirst) pytest_cmdline_main turns -n into its worker list.
    if (not _worker(config) and _active(config) and hasattr(config.option, "numprocesses")
            and config.option.numprocesses is None and not config.option.collectonly):
        from harness import devices

        if devices.gpus():
            config.option.numprocesses = _workers(config)
    return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if not _active(config):
        return None
    from harness import devices

    return _workers(config) if devices.gpus() else None


def _workers(config: pytest.Config) -> int:
    from harness import devices

    try:
        return devices.gpus() * devices.workers_per_gpu(config.getoption("kvconform_workers_per_gpu"))
    except ValueError as e:
        raise pytest.UsageError(f"--kvconform-workers-per-gpu / KVCONFORM_WORKERS_PER_GPU: {e}") from None


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _active(config):
        return
    _prepare_environment()
    import torch
    from hypothesis import settings

    from harness import devices, findings, fixtures, results, runner

    _check_options(config)
    worker = _worker(config)
    run = config.workerinput["kvconform_run"] if worker else results.new_run_id()
    config.stash[RUN] = run
    device = devices.worker_device(worker)
    if device.startswith("cuda") and (worker or not getattr(config.option, "numprocesses", None)):
        torch.cuda.set_device(device)  # kernels launch on the current device: this process's GPU
    if worker:  # torch's CPU thread pool is sized for the whole host in every worker: share the CPUs out instead
        share = len(os.sched_getaffinity(0)) // int(config.workerinput["workercount"])
        torch.set_num_threads(max(1, share))
    # --hypothesis-profile (hypothesis' own option) wins; else KVCONFORM_PROFILE; else by device.
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(profiles.name(os.environ.get("KVCONFORM_PROFILE",
                                                           "gpu" if device.startswith("cuda") else "dev")))
    spec = config.getoption("kvconform_subject") or os.environ.get("KVCONFORM_SUBJECT", "builtin")
    contracts = Path(config.getoption("kvconform_contracts_dir") or fixtures.ROOT)
    regressions = Path(config.getoption("kvconform_regressions_dir") or _default_regressions(config))
    args = [f"--kvconform-release={r}" for r in config.getoption("kvconform_release")]
    args.append(f"--kvconform-subject={spec}")
    args += [f"--kvconform-{o.replace('_', '-')}={v}" for o in ("backend", "cache_dtype")
             for v in config.getoption(f"kvconform_{o}")]
    for opt in ("contracts_dir", "regressions_dir", "known_findings"):
        if config.getoption(f"kvconform_{opt}"):
            args.append(f"--kvconform-{opt.replace('_', '-')}={config.getoption(f'kvconform_{opt}')}")
    try:
        session = runner.start(
            spec, config.getoption("kvconform_release"), contracts, Path(config.getoption("kvconform_results_dir")
                                                                          or Path.cwd() / "results"),
            regressions, Path(config.getoption("kvconform_known_findings") or findings.DIRECTORY), device,
            f"{run}-{worker or 'main'}", " ".join(shlex.quote(a) for a in args),
            tuple(config.getoption("kvconform_backend")), tuple(config.getoption("kvconform_cache_dtype")), run)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    session.say = _say(config)
    if worker and config.workerinput.get("kvconform_warming"):
        session.warming = True
    config.stash[SESSION] = session
    # The interpreter computes masked-out rows of a tile too (0/0 there is discarded by the kernel's store mask).
    config.addinivalue_line("filterwarnings", "ignore:invalid value encountered:RuntimeWarning")


def _say(config: pytest.Config):
    """A way to print from a thread while the main thread is stuck in an item: pytest's output capture is
    suspended first (the process ends right after, so nothing it captured is lost)."""
    import sys

    def say(text: str) -> None:
        capture = config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=False)
        print(text, file=sys.stderr, flush=True)

    return say


def _check_options(config: pytest.Config) -> None:
    """Option values no run could use are usage errors before anything runs, naming the option and what it takes."""
    n = config.getoption("kvconform_max_examples")
    if n is not None and n < 1:
        raise pytest.UsageError(f"--kvconform-max-examples={n}: takes a whole number >= 1")
    t = config.getoption("kvconform_timeout")
    if t is not None and t < 0:
        raise pytest.UsageError(f"--kvconform-timeout={t:g}: takes seconds >= 0 (0: no limit)")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Hand this run's id to a starting xdist worker: its lines belong to the controller's run."""
    if RUN in node.config.stash:
        node.workerinput["kvconform_run"] = node.config.stash[RUN]
        s = _session(node.config)
        node.workerinput["kvconform_warming"] = s is not None and s.warming is not None


def _default_regressions(config: pytest.Config) -> Path:
    own = Path(__file__).resolve().parent.parent / "fixtures" / "regressions"  # kvconform's own checkout
    return own if own.is_dir() and Path(config.rootpath) == own.parent.parent else Path.cwd() / "kvconform-regressions"


def _session(config: pytest.Config):
    return config.stash.get(SESSION, None)


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    s = _session(config)
    if s is None:
        return None
    from hypothesis import settings

    profile, name = settings.default, settings.get_current_profile_name()
    return [f"kvconform: subject {s.subject_name} on {s.device}, hypothesis profile {name} "
            f"(max_examples {config.getoption('kvconform_max_examples') or profile.max_examples}, "
            f"deadline {profile.deadline})"] + [f"kvconform release {r.describe()}" for r in s.releases] + [
        f"kvconform {s.subject_name} is not checked on {line}" for line in s.not_checked()]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """On CUDA, start compiling every kernel variant the run can draw (before xdist starts its workers): the checks
    that launch no kernel run meanwhile, kernel items wait for it, and their examples only load kernels."""
    config = session.config
    s = _session(config)
    if s is None or not _is_controller(config) or not s.device.startswith("cuda") or config.option.collectonly:
        return
    from harness import devices

    if s.warm_behind([f"cuda:{i}" for i in range(devices.gpus())], len(os.sched_getaffinity(0))):
        config.get_terminal_writer().line("kvconform warm-up: compiling behind the checks that launch no kernel")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    s = _session(node.config)
    if s is not None:
        s.workers[node.gateway.id] = getattr(node, "workeroutput", {}).get("kvconform", {})


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """Name the culprit in a crashed worker's report: the example that poisoned its device (its last result)."""
    s = _session(report.node.config)
    if s is None:
        return
    from harness.runner import POISONED

    files = s.results_dir.glob(f"*/results.{s.run}-{report.node.gateway.id}.jsonl")
    last = [json.loads(line) for f in sorted(files, key=lambda f: f.stat().st_mtime)
            for line in f.read_text().splitlines()[-1:]]
    if last and POISONED in last[-1]["diagnosis"]:
        report.longrepr = f"{report.longrepr}\n{last[-1]['outcome']}: {last[-1]['diagnosis']}\n{last[-1]['repro']}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    s = _session(session.config)
    if s is None:
        return
    if not _is_controller(session.config):
        session.config.workeroutput["kvconform"] = s.process_report()
        return
    if not s.workers:
        s.workers["main"] = s.process_report()
    if isinstance(s.warming, threading.Thread):
        s.warming.join()
    s.write_run()
    s.merge()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    s = _session(config)
    if s is not None and _is_controller(config):
        for line in s.summary():
            terminalreporter.write_line(line)


# ---- parametrisation ---------------------------------------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    s = _session(metafunc.config)
    if s is None:
        return
    from harness import runner

    check = _check_of(metafunc.module)
    if check is None:
        return
    if runner.missing(s, check.needs):  # not generated for this subject: no items, one not-applicable line per release
        metafunc.config.stash.setdefault(NOT_APPLICABLE, set()).add(check)
        for name in ("target", "release_contracts", "dense_target", "regression"):
            if name in metafunc.fixturenames:
                metafunc.parametrize(name, [])
        return
    if "target" in metafunc.fixturenames:
        targets = runner.targets(s, check)
        metafunc.parametrize("target", targets, ids=[f"{t.release.release}-{t.contract.name}" for t in targets])
    if "release_contracts" in metafunc.fixturenames:
        metafunc.parametrize("release_contracts", s.releases, ids=[r.release for r in s.releases])
    if "dense_target" in metafunc.fixturenames:
        targets = runner.dense_targets(s)
        metafunc.parametrize("dense_target", targets, ids=[f"{t.release.release}-dense-{t.mode}" for t in targets])
    if "regression" in metafunc.fixturenames:
        stored = runner.regressions(s, check.name)
        metafunc.parametrize("regression", stored,
                             ids=[f"{r.target.release.release}-{r.target.geometry}-{r.digest}" for r in stored])


@pytest.hookimpl(trylast=True)  # after -k / -m: a check the run left out gets no not-applicable line either
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    s = _session(config)
    if s is None:
        return
    from harness import runner

    # A check with no stored regressions has nothing to replay, a check the subject lacks a capability for does
    # not apply, and a session whose geometries no K/V check covers has no targets (each said in a not-applicable
    # line): no item, rather than a placeholder skip.
    na = config.stash.get(NOT_APPLICABLE, set())
    ours = {i: c for i in items if (c := _check_of(getattr(i, "module", None))) is not None}
    empty = [i for i, c in ours.items() if c in na or
             any("empty parameter set" in str(m.kwargs.get("reason", "")) for m in i.iter_markers("skip"))]
    if _worker(config) in (None, "gw0") and not config.option.collectonly:  # one process records them
        for check in dict.fromkeys(ours[i] for i in empty if ours[i] in na):
            runner.record_not_applicable(s, check)
        runner.record_outside(s)
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [i for i in items if i not in empty]
    kept = sorted((i for i in items if i in ours),
                  key=lambda i: runner.order(ours[i], "regression" in getattr(i, "fixturenames", ())))
    items[:] = kept + [i for i in items if i not in ours]


def _check_of(module) -> object | None:
    """The check (harness.checks.Check) a suite module implements; None for any other module."""
    from harness.checks import Check

    check = getattr(module, "CHECK", None)
    return check if isinstance(check, Check) else None


# ---- the fixture the suites use ----------------------------------------------------------------------------------


class Conformance:
    """The runner for one pytest item: runs a check and turns how it settled into pytest's words (a known finding
    an xfail, examples not run or unsupported a skip, a lost device the end of this process)."""

    def __init__(self, request: pytest.FixtureRequest):
        from harness import runner

        self.config = request.config
        s = _session(request.config)
        if s is None:
            pytest.skip("kvconform is not active in this run (no --kvconform-* option)")
        node = request.node.nodeid.split("[")[0].removesuffix("_regression") + "_regression"
        timeout = request.config.getoption("kvconform_timeout")
        timeout = TIMEOUTS[s.device.split(":")[0]] if timeout is None else timeout
        check = _check_of(request.module)
        if check is not None and check.kernels:
            try:
                s.await_warmup(timeout)
            except TimeoutError as e:
                pytest.fail(f"timeout: {request.node.nodeid}: {e} (a harness limit, --kvconform-timeout)",
                            pytrace=False)
        self.runner = runner.Runner(s, f"pytest {node}", request.config.getoption("kvconform_max_examples"),
                                    request.node.nodeid, timeout)

    def __getattr__(self, name: str):
        return getattr(self.runner, name)  # the runner's helpers and recorders, as the checks call them

    def run(self, *args, **kwargs) -> None:
        self._settle(self._guard(self.runner.run, *args, **kwargs))

    def replay(self, *args, **kwargs) -> None:
        self._settle(self._guard(self.runner.replay, *args, **kwargs))

    def _guard(self, fn, *args, **kwargs):
        from harness.runner import DeviceLost, TimedOut

        try:
            return fn(*args, **kwargs)
        except TimedOut as e:
            pytest.fail(str(e), pytrace=False)
        except DeviceLost as e:
            if _worker(self.config):  # a fresh xdist worker takes the remaining items; this item is reported as its crash
                os._exit(3)
            pytest.exit(f"{e}\nrun with xdist (-n) to go on in a fresh process after such a fault", returncode=1)

    def _settle(self, state) -> None:
        if state.known:
            pytest.xfail("; ".join(f"known finding {f.id}: {f.outcome} ({f.reason}; {f.link})"
                                   for f in state.known.values()))
        if state.not_run:
            pytest.skip(f"not run on {'; '.join(sorted(state.not_run))}")
        if state.ran == 0 and state.unsupported:
            pytest.skip(f"{self.runner.s.subject_name} supports none of the examples: "
                        f"{'; '.join(sorted(state.unsupported))}")


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> Conformance:
    return Conformance(request)
