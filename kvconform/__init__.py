"""kvconform's pytest plugin: options, and the wiring from pytest (and pytest-xdist) to the library
(harness.run).

Installed, it loads through the `pytest11` entry point and only adds its options. A run that asks for kvconform (any
`--kvconform-*` option, the suites named on the command line, or a conftest that sets `KVCONFORM_SUITES = True`, as
this repository's conformance/ does) gets a `KvconformPlugin` registered for it, with kvconform's hypothesis
profiles; every other hook, the `conformance` fixture and all state are that object's. The suites are
`kvconform.suites` (`pytest --pyargs kvconform.suites --kvconform-subject mymod:MySubject ...`).
"""

from __future__ import annotations

import os
import shlex
import sysconfig
from pathlib import Path

import pytest

from harness.device import limits

FULL_FAILURES = 3  # new findings a process shows in full; later ones by their finding and REPRO line
PLUGIN = "kvconform-run"  # the name the active run's KvconformPlugin is registered under
OPTIONS = ("release", "subject", "max_examples", "results_dir", "contracts_dir", "known_findings", "regressions_dir",
           "workers_per_gpu", "backend", "cache_dtype", "timeout")


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
                     f"0: no limit. Default {limits.DEFAULTS['cuda']:g} on CUDA, {limits.DEFAULTS['cpu']:g} on the CPU")
    g.addoption("--kvconform-results-dir", default=None, help="where <release>/results.jsonl go (default: ./results)")
    g.addoption("--kvconform-contracts-dir", default=None,
                help="recorded contracts to replay (default: the ones kvconform ships)")
    g.addoption("--kvconform-known-findings", default=None,
                help="folder of known-findings files, <subject>.toml (default: the ones kvconform ships)")
    g.addoption("--kvconform-regressions-dir", default=None,
                help="where shrunk failing examples are kept and replayed from (default: <results dir>/regressions; "
                     "kvconform's own subjects in its own checkout: fixtures/regressions)")
    g.addoption("--kvconform-workers-per-gpu", type=int, default=None,
                help="on CUDA the suites run in pytest-xdist workers, this many per visible GPU, each pinned to "
                     "one GPU (env KVCONFORM_WORKERS_PER_GPU; default 8); -n overrides")


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config):
    # A wrapper: it runs before xdist's own (tryfirst) pytest_cmdline_main turns -n into its worker list, and before
    # hypothesis' pytest_configure loads --hypothesis-profile, which may name one of kvconform's profiles.
    if _active(config):
        from harness.draws import profiles

        profiles.register()
        if config.getoption("hypothesis_profile", None):
            try:
                profiles.check_named(config.getoption("hypothesis_profile"))
            except ValueError as e:
                raise pytest.UsageError(str(e)) from None
        plugin = KvconformPlugin(config)
        config.pluginmanager.register(plugin, PLUGIN)
        plugin.size_xdist()
        _show_skip_reasons(config)
    return (yield)


def _show_skip_reasons(config: pytest.Config) -> None:
    """A skipped item's reason is what it did not check (examples not run, unsupported by the subject): the short
    summary lists skips with their reasons unless -r already does (s, a, A) or turns the summary off (N). Set before
    the terminal reporter reads -r in its pytest_configure."""
    chars = config.option.reportchars
    if not set(chars) & set("saAN"):
        config.option.reportchars = chars + "s"


def _worker(config: pytest.Config) -> str | None:
    """This process's xdist worker id (gw0, ...), from the input xdist gives its workers; None in the controller or
    a run without xdist."""
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


class KvconformPlugin:
    """The hooks and the `conformance` fixture of one run that uses kvconform: options and xdist's worker input
    handed to the library (harness.run, devices, profiles), its outcomes to pytest."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.worker = _worker(config)
        self.session = None  # harness.run.session.Session, from pytest_configure
        self.warming = None  # harness.run.warmup.Warming in the controller that started one; True in its workers
        self.run = ""  # this run's id: made by the controller, handed to its xdist workers
        self.command = ""  # what starts pytest in the commands this run prints (harness.run.session.pytest_command)
        self.not_applicable: set = set()  # the checks (harness.checks) the subject lacks a capability for
        self.failures = 0  # new findings this process has reported (the first FULL_FAILURES in full)

    def size_xdist(self) -> None:
        """On CUDA, no -n means GPUs x workers-per-GPU workers (-n 0 keeps one process)."""
        option = self.config.option
        if self.worker is None and getattr(option, "numprocesses", "") is None and not option.collectonly:
            option.numprocesses = self._workers() or None  # None without CUDA: xdist stays off

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_auto_num_workers(self, config: pytest.Config) -> int | None:
        return self._workers() or None

    def _workers(self) -> int:
        from harness.device import devices

        try:
            return devices.workers(self.config.getoption("kvconform_workers_per_gpu"))
        except ValueError as e:
            raise pytest.UsageError(f"--kvconform-workers-per-gpu / KVCONFORM_WORKERS_PER_GPU: {e}") from None

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        from harness.device import devices

        devices.prepare_triton()  # before any kernel module is imported
        from harness import results
        from harness.draws import profiles
        from harness.recordings import store
        from harness.results import findings
        from harness.run import session as sessions
        from kvconform import subjects

        _check_options(config)
        worker = self.worker
        self.run = config.workerinput["kvconform_run"] if worker else results.new_run_id()
        # The controller's interpreter and its options: an xdist worker is started without them.
        self.command = config.workerinput["kvconform_command"] if worker else sessions.pytest_command()
        starts = getattr(config.option, "numprocesses", None)
        device = devices.settle(worker, int(config.workerinput["workercount"]) if worker else 1, bool(starts))
        if not worker:
            devices.share_blas(starts)
        if not config.getoption("hypothesis_profile", None):  # hypothesis' own option wins
            try:
                profiles.load(device)
            except ValueError as e:
                raise pytest.UsageError(str(e)) from None
        spec = config.getoption("kvconform_subject") or os.environ.get("KVCONFORM_SUBJECT", "builtin")
        contracts = Path(config.getoption("kvconform_contracts_dir") or store.ROOT)
        results_dir = Path(config.getoption("kvconform_results_dir") or Path.cwd() / "results")
        regressions = Path(config.getoption("kvconform_regressions_dir") or _default_regressions(config, spec,
                                                                                                   results_dir))
        args = [f"--kvconform-release={r}" for r in config.getoption("kvconform_release")]
        args.append(f"--kvconform-subject={spec}")
        args += [f"--kvconform-{o.replace('_', '-')}={v}" for o in ("backend", "cache_dtype")
                 for v in config.getoption(f"kvconform_{o}")]
        # Every option a printed command needs to run as this run did (where its lines go, what it replays from).
        for opt in ("results_dir", "contracts_dir", "regressions_dir", "known_findings", "max_examples", "timeout"):
            if config.getoption(f"kvconform_{opt}") is not None:
                args.append(f"--kvconform-{opt.replace('_', '-')}={config.getoption(f'kvconform_{opt}')}")
        try:
            session = sessions.start(
                subjects.spec(spec), config.getoption("kvconform_release"), contracts, results_dir,
                regressions, Path(config.getoption("kvconform_known_findings") or findings.DIRECTORY), device,
                f"{self.run}-{worker or 'main'}", " ".join(shlex.quote(a) for a in args),
                tuple(config.getoption("kvconform_backend")), tuple(config.getoption("kvconform_cache_dtype")),
                self.run, self.command)
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        from harness.run import regressions

        gone = None if worker else regressions.missing(session, config.option.keyword)
        if gone:
            raise pytest.UsageError(gone)
        session.say = _say(config)
        if worker and config.workerinput.get("kvconform_warming"):
            self.warming = True
        self.session = session
        # The interpreter computes masked-out rows of a tile too (0/0 there is discarded by the kernel's store mask).
        config.addinivalue_line("filterwarnings", "ignore:invalid value encountered:RuntimeWarning")

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """Hand this run's id to a starting xdist worker: its lines belong to the controller's run."""
        node.workerinput["kvconform_run"] = self.run
        node.workerinput["kvconform_command"] = self.command
        node.workerinput["kvconform_warming"] = self.warming is not None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        """A failing run stays readable: each process shows its first FULL_FAILURES new findings in full, every
        later one as its finding and REPRO line alone; the result lines hold them all. In full (unless --tb or
        --full-trace asks otherwise) is the subject's own frames where it raised, the suite's line and kvconform's
        verdict with the shrunk example: the harness's frames between them say nothing of the subject."""
        report = yield
        from harness.run.loop import NewFinding

        if report.failed and call.excinfo is not None and call.excinfo.errisinstance(NewFinding):
            self.failures += 1
            if self.failures > FULL_FAILURES:
                report.longrepr = (f"{call.excinfo.value}\n(new finding {self.failures} of this process, shown short; "
                                   f"every result line is in {self.session.results_dir})")
            elif item.config.getoption("tbstyle") == "auto" and not item.config.getoption("fulltrace"):
                finding = call.excinfo.value
                report.longrepr = call.excinfo.getrepr(style="short", funcargs=False, tbfilter=lambda e: (
                    e.traceback.filter(lambda f: f.path == item.path) if e.value is finding else e.traceback.filter(e)))
        return report

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return self._header(config)

    def _header(self, config: pytest.Config) -> list[str]:
        """The run's first lines: subject, device, profile and seed, examples per check, each release (its
        geometries where a check the subject takes hands it one's cache) and what it leaves unchecked."""
        from hypothesis import settings

        from harness.draws import profiles
        from harness.run import coverage

        s = self.session
        geometries = coverage.takes_geometries(s)
        n = config.getoption("kvconform_max_examples") or settings.default.max_examples
        shrink = "failing examples shrunk" if profiles.shrinks() else "no shrinking: a failing item stops at its first"
        if not profiles.explicit():
            shrink += "; no explicit examples: generated ones alone"
        return [f"kvconform: subject {s.subject_name} on {s.device}, hypothesis profile "
                f"{settings.get_current_profile_name()} ({shrink}), seed {s.seed} (--hypothesis-seed={s.seed} draws "
                "these examples again, live or replayed)",
                f"kvconform examples per geometry: {coverage.plan(s, n)}; stored regressions first"] + [
            f"kvconform release {r.describe()}" for r in s.releases if geometries or r.error] + [
            f"kvconform {line}" for line in coverage.coverage(s)]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """On CUDA, start compiling every kernel variant the run can draw (before xdist starts its workers): the
        checks that launch no kernel run meanwhile, kernel items wait for it, and their examples only load kernels.
        Under -q, where pytest prints no header, the run's header lines are printed here all the same."""
        s = self.session
        config = session.config
        if self.worker is None and config.get_verbosity() < 0 and not config.option.collectonly:
            for line in self._header(config):
                config.get_terminal_writer().line(line)
        if self.worker is not None or not s.device.startswith("cuda") or session.config.option.collectonly:
            return
        from harness.device import devices
        from harness.run import warmup

        self.warming = warmup.behind(s, [f"cuda:{i}" for i in range(devices.gpus())], len(os.sched_getaffinity(0)))
        if self.warming is not None:
            session.config.get_terminal_writer().line("kvconform warm-up: compiling behind the checks that launch "
                                                      "no kernel")

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        self.session.sink.workers[node.gateway.id] = getattr(node, "workeroutput", {}).get("kvconform", {})

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched) -> None:
        """Name the culprit in a crashed worker's report: the example that poisoned its device."""
        culprit = self.session.sink.culprit(report.node.gateway.id)
        if culprit:
            report.longrepr = f"{report.longrepr}\n{culprit}"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        s = self.session
        if self.worker is not None:
            session.config.workeroutput["kvconform"] = s.sink.process_report(s.device)
            return
        if not s.sink.workers:
            s.sink.workers["main"] = s.sink.process_report(s.device)
        warming = self._warming()
        if warming is not None:
            warming.thread.join()
        s.sink.write_run([r.release for r in s.releases], warming.warmup if warming is not None else None)
        s.sink.merge(s.releases)

    def _warming(self):
        """The warm-up this process started (harness.run.warmup.Warming), if any."""
        return None if self.warming in (None, True) else self.warming

    def pytest_terminal_summary(self, terminalreporter, config: pytest.Config) -> None:
        from harness.run import coverage

        if self.worker is None:
            s, warming = self.session, self._warming()
            for line in s.sink.summary(s.releases, warming.lines() if warming is not None else [],
                                       coverage.coverage(s)):
                terminalreporter.write_line(line)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        from harness.run import implementation, regressions

        s = self.session
        check = _check_of(metafunc.module)
        if check is None:
            return
        if s.missing(check.needs):  # not generated for this subject: no items, a not-applicable line
            self.not_applicable.add(check)
            for name in ("target", "release_contracts", "regression"):
                if name in metafunc.fixturenames:
                    metafunc.parametrize(name, [])
            return
        if "target" in metafunc.fixturenames:
            items = implementation.targets(s, check)
            metafunc.parametrize("target", items, ids=[t.id for t in items])
        if "release_contracts" in metafunc.fixturenames:
            metafunc.parametrize("release_contracts", s.releases, ids=[r.release for r in s.releases])
        if "regression" in metafunc.fixturenames:
            stored = regressions.regressions(s, check)
            metafunc.parametrize("regression", stored,
                                 ids=[regressions.item_id(r.target, r.digest) for r in stored])

    @pytest.hookimpl(trylast=True)  # after -k / -m: a check the run left out gets no not-applicable line either
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        from harness.run import coverage, targets

        s = self.session
        # A check with no stored regressions has nothing to replay, a check the subject lacks a capability for does
        # not apply, and a session whose geometries no K/V check covers has no targets (each said in a not-applicable
        # line): no item, rather than a placeholder skip.
        na = self.not_applicable
        ours = {i: c for i in items if (c := _check_of(getattr(i, "module", None))) is not None}
        empty = [i for i, c in ours.items() if c in na or
                 any("empty parameter set" in str(m.kwargs.get("reason", "")) for m in i.iter_markers("skip"))]
        if self.worker in (None, "gw0") and not config.option.collectonly:  # one process records them
            for check in dict.fromkeys(ours[i] for i in empty if ours[i] in na):
                coverage.record_not_applicable(s, check)
            coverage.record_outside(s)
        if empty:
            config.hook.pytest_deselected(items=empty)
            items[:] = [i for i in items if i not in empty]
        kept = sorted((i for i in items if i in ours),
                      key=lambda i: targets.order(ours[i], "regression" in getattr(i, "fixturenames", ())))
        items[:] = kept + [i for i in items if i not in ours]

    @pytest.fixture
    def conformance(self, request: pytest.FixtureRequest) -> Conformance:
        return Conformance(self, request)


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


def _default_regressions(config: pytest.Config, subject: str, results_dir: Path) -> Path:
    """kvconform's own subjects in its own checkout keep their regressions under fixtures/ (committed guards); every
    other subject's go to the results folder, never into kvconform's checkout."""
    from kvconform.subjects import own

    checkout = Path(__file__).resolve().parent.parent
    guards = checkout / "fixtures" / "regressions"
    if own(subject) and guards.is_dir() and Path(config.rootpath) == checkout:
        return guards
    return results_dir / "regressions"


def _named(request: pytest.FixtureRequest, test: str) -> str:
    """How a command started where this run was names test `test` of the request's suite module, ready to paste:
    the module's file relative to that folder where it lies under it (a kvconform checkout), else the installed
    module through --pyargs (a host project: kvconform's files are not there, or lie in a venv inside it)."""
    path = Path(request.module.__file__).resolve()
    here = Path(request.config.invocation_params.dir).resolve()
    if path.is_relative_to(here) and not path.is_relative_to(Path(sysconfig.get_paths()["purelib"]).resolve()):
        return shlex.quote(f"{path.relative_to(here)}::{test}")
    # A suite file is importable as kvconform.suites.<name> wherever kvconform is installed, whatever name this
    # run imported it under (conformance.<name> in a checkout); a bare checkout has no kvconform.suites at all.
    try:
        import kvconform.suites
    except ModuleNotFoundError:
        return "--pyargs " + shlex.quote(f"{request.module.__name__}::{test}")
    suites = Path(kvconform.suites.__file__).resolve().parent
    module = f"kvconform.suites.{path.stem}" if path.parent == suites else request.module.__name__
    return "--pyargs " + shlex.quote(f"{module}::{test}")


def _check_of(module) -> object | None:
    """The check (harness.checks.Check) a suite module implements; None for any other module."""
    from harness.checks import Check

    check = getattr(module, "CHECK", None)
    return check if isinstance(check, Check) else None


class Conformance:
    """One pytest item's way into the library: runs a check (harness.run.loop) and turns how it settled into
    pytest's words (a known finding an xfail, examples not run or unsupported a skip, a lost device the end of this
    process); records a whole item's or release's outcome."""

    def __init__(self, plugin: KvconformPlugin, request: pytest.FixtureRequest):
        from harness.device import compiles
        from harness.run import loop

        self.worker = plugin.worker
        self.session = s = plugin.session
        function = request.node.originalname.removesuffix("_regression") + "_regression"
        timeout = limits.item_limit(request.config.getoption("kvconform_timeout"), s.device)
        check = _check_of(request.module)
        if check is not None and check.kernels and plugin.warming is not None:
            try:
                compiles.await_warmup(s.run, timeout)
            except TimeoutError as e:
                pytest.fail(f"timeout: {request.node.nodeid}: {e} (a harness limit, --kvconform-timeout)",
                            pytrace=False)
        self.loop = loop.Loop(s, _named(request, function),
                              request.config.getoption("kvconform_max_examples"), _named(request, request.node.name),
                              timeout)

    def run(self, target, check) -> None:
        """Run `check` over examples of `target`."""
        self._settle(self._guard(self.loop.run, target, check))

    def replay(self, regression, check) -> None:
        """Run `check` over one kept failing example."""
        self._settle(self._guard(self.loop.replay, regression, check))

    def record_target(self, target, check, word, diagnosis: str = "") -> None:
        """Record an outcome of a whole (release, geometry) item, e.g. a check that cannot run here."""
        self.loop.record_target(target, check, word, diagnosis)

    def record_release(self, r, check, word, diagnosis: str = "") -> str:
        """Record a whole-release outcome; the known finding's id if one predicts it."""
        return self.loop.record_release(r, check, word, diagnosis)

    def _guard(self, fn, *args):
        from harness.run.loop import DeviceLost, TimedOut

        try:
            return fn(*args)
        except TimedOut as e:
            pytest.fail(str(e), pytrace=False)
        except DeviceLost as e:
            if self.worker:  # a fresh xdist worker takes the remaining items; this item is reported as its crash
                os._exit(3)
            pytest.exit(f"{e}\nrun with xdist (-n) to go on in a fresh process after such a fault", returncode=1)

    def _settle(self, state) -> None:
        if state.known:
            pytest.xfail("; ".join(f"known finding {f.id}: {f.outcome} ({f.reason}; {f.link})"
                                   for f in state.known.values()))
        if state.not_run:
            pytest.skip(f"not run on {'; '.join(sorted(state.not_run))}")
        if state.ran == 0 and state.unsupported:
            pytest.skip(f"{self.session.subject_name} supports none of the examples: "
                        f"{'; '.join(sorted(state.unsupported))}")
