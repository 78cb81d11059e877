"""Conformance suites: options, the session's release contracts, hypothesis profiles, and the example runner.

Every check is a function (subject, example, extra) -> Outcome run by `Runner` over hypothesis-drawn examples of
one (release, geometry). The runner records one result line per example (harness.results), turns a known finding
into an xfail with its reason, and on a new finding raises with ONE line that reproduces it; the shrunk example
is kept under fixtures/regressions/<subject>/ and replayed first by every later session.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path


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


_prepare_environment()

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness import compiles, devices, findings, fixtures, results  # noqa: E402
from harness.cache import Paging, read, write  # noqa: E402
from harness.compare import bits, diagnose  # noqa: E402
from harness.contract import Contract, ContractError  # noqa: E402
from harness.cases import SPARSITY_MODES  # noqa: E402
from harness.matrix import version_key  # noqa: E402
from harness.strategies import CPU, GPU, Example, cases, examples, warmup_shards  # noqa: E402
from harness.subjects import load_subject  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONTRACTS = str(fixtures.ROOT)
REGRESSIONS = str(REPO / "fixtures" / "regressions")
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
DEVICE = devices.worker_device(WORKER)
SIZES = GPU if DEVICE.startswith("cuda") else CPU
# Checks that launch the subject's kernels; the others (split agreement, malformed caches, contracts) run first.
KERNEL_CHECKS = ("bit-identity", "determinism", "oracle")
POISONED = "the device is unusable after this call"
# Examples per (release, geometry, check). ci: the CPU interpreter, every recorded release within CI's budget
# (see docs/suites.md for the measured cost); gpu: one H200, >= 2,000 examples per release; nightly: more.
# No deadline on CPU (the interpreter's speed depends on the machine's load); on GPU a generous one that a first
# compile of a new constexpr combination (seconds) stays under, so that only a hang or a pathological slow-down trips.
_COMMON = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], report_multiple_bugs=False,
               print_blob=True)
PROFILES = {
    "dev": dict(max_examples=10, deadline=None),
    "ci": dict(max_examples=8, deadline=None, database=None, derandomize=True),
    "gpu": dict(max_examples=60, deadline=timedelta(seconds=20), database=None),
    "nightly": dict(max_examples=300, deadline=timedelta(seconds=60), database=None),
}
CHEAP_FACTOR = 5
for _name, _values in PROFILES.items():
    settings.register_profile(_name, **_COMMON, **_values)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kvconform")
    g.addoption("--release", action="append", default=[],
                help="vLLM release to check (repeatable; 'recorded' = every recorded release). Default: the "
                     "installed vLLM, probed live.")
    g.addoption("--subject", default=os.environ.get("KVCONFORM_SUBJECT", "builtin"),
                help="subject under test: builtin, modelopt, mutant:<name> or module:Class (env KVCONFORM_SUBJECT)")
    g.addoption("--max-examples", type=int, default=None, help="override the hypothesis profile's max_examples")
    g.addoption("--results-dir", default=str(REPO / "results"), help="where results/<release>/results.jsonl go")
    g.addoption("--contracts-dir", default=CONTRACTS, help="recorded contracts to replay")
    g.addoption("--known-findings", default=str(findings.DIRECTORY),
                help="folder of known-findings files, <subject>.toml")
    g.addoption("--regressions-dir", default=REGRESSIONS,
                help="where shrunk failing examples are kept and replayed from")
    g.addoption("--workers-per-gpu", type=int, default=None,
                help="on CUDA the suites run in pytest-xdist workers, this many per visible GPU, each pinned to "
                     f"one GPU (env KVCONFORM_WORKERS_PER_GPU; default {devices.WORKERS_PER_GPU}); -n overrides")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Before xdist reads -n: on CUDA, no -n means GPUs x workers-per-GPU workers (-n 0 keeps one process).
    if WORKER or not devices.gpus() or not config.pluginmanager.hasplugin("xdist"):
        return
    if config.option.numprocesses is None and not config.option.collectonly:
        config.option.numprocesses = _workers(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    return _workers(config) if devices.gpus() else None


def _workers(config: pytest.Config) -> int:
    try:
        return devices.gpus() * devices.workers_per_gpu(config.getoption("workers_per_gpu"))
    except ValueError as e:
        raise pytest.UsageError(f"--workers-per-gpu / KVCONFORM_WORKERS_PER_GPU: {e}") from None


def pytest_configure(config: pytest.Config) -> None:
    # One id per session, inherited by its xdist workers: their result files are told apart from another session's.
    os.environ.setdefault("KVCONFORM_RUN", f"run{os.getpid()}")
    if DEVICE.startswith("cuda") and (WORKER or not getattr(config.option, "numprocesses", None)):
        torch.cuda.set_device(DEVICE)  # kernels launch on the current device: this process's GPU
    if WORKER:  # torch's CPU thread pool is sized for the whole host in every worker: share the CPUs out instead
        share = len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        torch.set_num_threads(max(1, share))
    # --hypothesis-profile (hypothesis' own option) wins; else KVCONFORM_PROFILE; else by device.
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(os.environ.get("KVCONFORM_PROFILE", "gpu" if DEVICE.startswith("cuda") else "dev"))
    config.kvconform = Session.start(config)
    # The interpreter computes masked-out rows of a tile too (0/0 there is discarded by the kernel's store mask).
    config.addinivalue_line("filterwarnings", "ignore:invalid value encountered:RuntimeWarning")


# ---- the session: releases, their contracts, the subject ----------------------------------------------------


@dataclass(frozen=True)
class ReleaseContracts:
    """One release's contracts for this session, live (probed, with drift against the recording) or replayed."""

    release: str
    source: str  # "live" or "replay"
    contracts: tuple[Contract, ...]
    error: str = ""  # the contract-error when they could not be read
    drift: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.error:
            return f"{self.release}: contract-error: {self.error}"
        how = "live probe of the installed vLLM" if self.source == "live" else "replay of the recorded fixture"
        return f"{self.release}: {how}, {len(self.contracts)} contracts: {', '.join(c.name for c in self.contracts)}"


def _vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _load_release(release: str, contracts_dir: Path) -> ReleaseContracts:
    if not _vllm_installed():
        try:
            return ReleaseContracts(release, "replay", fixtures.load(release, contracts_dir).contracts)
        except ContractError as e:
            return ReleaseContracts(release, "replay", (), str(e))
    from harness.probe import ProbeError, probe

    try:
        live = probe()
    except ProbeError as e:
        return ReleaseContracts(release, "live", (), str(e))
    if release != "main" and live.release != release:
        return ReleaseContracts(release, "live", (), f"the installed vLLM is {live.release}, not {release}")
    if release not in fixtures.releases(contracts_dir):
        return ReleaseContracts(release, "live", live.contracts, drift=(f"no recording of {release} to compare",))
    return ReleaseContracts(release, "live", live.contracts,
                            drift=tuple(fixtures.drift(fixtures.load(release, contracts_dir), live)))


@dataclass
class Session:
    """What every test of this pytest process shares."""

    subject_name: str
    subject: object
    releases: list[ReleaseContracts]
    findings: tuple[findings.Finding, ...]
    results_dir: Path
    regressions_dir: Path
    worker: str
    args: str  # pytest options that select this session, for repro lines
    warmup: compiles.Warmup | None = None
    workers: dict[str, dict] = field(default_factory=dict)  # xdist worker id -> what it reported at its end

    @classmethod
    def start(cls, config: pytest.Config) -> Session:
        contracts_dir = Path(config.getoption("contracts_dir"))
        asked = config.getoption("release")
        if not asked:
            if not _vllm_installed():
                raise pytest.UsageError("vLLM is not installed: name the release(s) to replay with --release "
                                        f"(recorded: {', '.join(fixtures.releases(contracts_dir))})")
            from harness.probe import release

            asked = [release()]
        names = [r for a in asked for r in (fixtures.releases(contracts_dir) if a == "recorded" else [a])]
        subject = load_subject(config.getoption("subject"))
        name = subject.name
        args = [f"--release={r}" for r in asked] + [f"--subject={config.getoption('subject')}"]
        for opt, default in (("contracts_dir", CONTRACTS), ("regressions_dir", REGRESSIONS)):
            if config.getoption(opt) != default:
                args.append(f"--{opt.replace('_', '-')}={config.getoption(opt)}")
        known = findings.load(name, Path(config.getoption("known_findings")))
        return cls(name, subject, [_load_release(r, contracts_dir) for r in names], known,
                   Path(config.getoption("results_dir")), Path(config.getoption("regressions_dir")),
                   f"{os.environ['KVCONFORM_RUN']}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
                   " ".join(shlex.quote(a) for a in args))


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_report_header(config: pytest.Config) -> list[str]:
    s: Session = config.kvconform
    profile, name = settings.default, settings.get_current_profile_name()
    return [f"kvconform: subject {s.subject_name} on {DEVICE}, hypothesis profile {name} "
            f"(max_examples {config.getoption('max_examples') or profile.max_examples}, "
            f"deadline {profile.deadline})"] + [f"kvconform release {r.describe()}" for r in s.releases]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """On CUDA, compile every kernel variant the run can draw before any example (and before xdist starts its
    workers, whose examples then only load them from the disk cache)."""
    config = session.config
    s: Session = config.kvconform
    contract = next((c for r in s.releases for c in r.contracts), None)
    if not _is_controller(config) or not DEVICE.startswith("cuda") or config.option.collectonly or contract is None:
        return
    gpus = [f"cuda:{i}" for i in range(devices.gpus())]
    cpus = len(os.sched_getaffinity(0))
    shards = warmup_shards(SIZES)
    s.warmup = compiles.warm(config.getoption("subject"), shards, contract, gpus, cpus,
                             compiles.fingerprint(s.subject, shards, gpus))
    config.get_terminal_writer().line(f"kvconform {s.warmup.describe()}")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    node.config.kvconform.workers[node.gateway.id] = getattr(node, "workeroutput", {}).get("kvconform", {})


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """Name the culprit in a crashed worker's report: the example that poisoned its device (its last result)."""
    s: Session = report.node.config.kvconform
    files = s.results_dir.glob(f"*/results.{os.environ['KVCONFORM_RUN']}-{report.node.gateway.id}.jsonl")
    last = [json.loads(line) for f in sorted(files, key=lambda f: f.stat().st_mtime)
            for line in f.read_text().splitlines()[-1:]]
    if last and POISONED in last[-1]["diagnosis"]:
        report.longrepr = f"{report.longrepr}\n{last[-1]['outcome']}: {last[-1]['diagnosis']}\n{last[-1]['repro']}"


def _process_report() -> dict:
    c = compiles.counts()
    return {"device": DEVICE, "compiled": c.compiled, "loaded": c.loaded, "results": Runner.recorded}


def pytest_sessionfinish(session: pytest.Session) -> None:
    s: Session = session.config.kvconform
    if not _is_controller(session.config):
        session.config.workeroutput["kvconform"] = _process_report()
        return
    if not s.workers:
        s.workers["main"] = _process_report()
    s.results_dir.mkdir(parents=True, exist_ok=True)
    (s.results_dir / "run.json").write_text(json.dumps({
        "subject": s.subject_name, "releases": [r.release for r in s.releases],
        "warmup": dataclasses.asdict(s.warmup) if s.warmup else None, "processes": s.workers}, indent=1) + "\n")
    for r in s.releases:
        if results.release_dir(s.results_dir, r.release).is_dir():
            path = results.merge(s.results_dir, r.release, os.environ["KVCONFORM_RUN"] + "-")
            if path.exists():
                _mark_stale(s, r, path)


def _mark_stale(s: Session, r: ReleaseContracts, path: Path) -> None:
    # Done on merged results: with xdist a finding may apply on one worker and happen on another.
    rows = [x for x in results.read(path.parent.parent) if x.release == r.release and x.subject == s.subject_name]
    happened = {x.known for x in rows if x.known}
    for f in s.findings:
        applied = any(f.applies(x.release, x.geometry, x.sparsity, x.check) and x.outcome != "unsupported"
                      for x in rows)
        if applied and f.id not in happened:
            results.append(s.results_dir, results.Result(
                r.release, r.source, s.subject_name, f.geometry, f.check, f.sparsity, results.STALE,
                diagnosis=f"known finding {f.id} ({f.outcome}: {f.reason}) applied but did not happen", known=f.id))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    s: Session = config.kvconform
    if not _is_controller(config):
        return
    if s.warmup:
        terminalreporter.write_line(f"kvconform {s.warmup.describe()}")
    for name, w in sorted(s.workers.items()):
        if w:
            terminalreporter.write_line(f"kvconform process {name} on {w['device']}: {w['results']} results; kernels "
                                        f"{w['compiled']} compiled, {w['loaded']} loaded from the disk cache")
        else:
            terminalreporter.write_line(f"kvconform process {name}: ended without reporting (crashed or killed)")
    for r in s.releases:
        path = results.release_dir(s.results_dir, r.release) / "results.jsonl"
        if not path.exists():
            continue
        rows = [x for x in results.read(path.parent.parent) if x.release == r.release]
        counts: dict[str, int] = {}
        for x in rows:
            counts[x.outcome] = counts.get(x.outcome, 0) + 1
        terminalreporter.write_line(
            f"kvconform {r.release} ({r.source}) {s.subject_name}: "
            + ", ".join(f"{n} {word}" for word, n in sorted(counts.items())) + f" -> {path}")
        for x in rows:
            if x.outcome == results.STALE:
                terminalreporter.write_line(f"  STALE {x.known}: {x.diagnosis}")


# ---- parametrization: (release, geometry) targets and stored regressions ---------------------------------------


@dataclass(frozen=True)
class Target:
    """One release and one of its geometries; `label` names a check that uses no cache (the oracle's "dense"),
    `mode` the one sparsity mode its cases take (any when empty)."""

    release: ReleaseContracts
    contract: Contract
    label: str = ""
    mode: str = ""

    @property
    def geometry(self) -> str:
        return self.label or self.contract.name


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    s: Session = metafunc.config.kvconform
    if "target" in metafunc.fixturenames:
        targets = [Target(r, c) for r in s.releases for c in r.contracts]
        metafunc.parametrize("target", targets, ids=[f"{t.release.release}-{t.contract.name}" for t in targets])
    if "release_contracts" in metafunc.fixturenames:
        metafunc.parametrize("release_contracts", s.releases, ids=[r.release for r in s.releases])
    if "dense_target" in metafunc.fixturenames:
        # The dense forward alone, which no release changes: once per session, under its newest release (a nox
        # session holds one), one item per sparsity mode so that the float64 items run side by side.
        newest = max((r for r in s.releases if r.contracts), key=lambda r: version_key(r.release), default=None)
        targets = [Target(newest, newest.contracts[0], "dense", m) for m in SPARSITY_MODES] if newest else []
        metafunc.parametrize("dense_target", targets, ids=[f"{t.release.release}-dense-{t.mode}" for t in targets])
    if "regression" in metafunc.fixturenames:
        stored = [(Target(r, ex.contract, label), ex, extra, digest)
                  for ex, extra, label, digest in load_regressions(s.regressions_dir / s.subject_name,
                                                                   metafunc.module.CHECK)
                  for r in s.releases if ex.contract.name in {c.name for c in r.contracts}]
        metafunc.parametrize("regression", stored,
                             ids=[f"{t.release.release}-{t.geometry}-{d}" for t, _, _, d in stored])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A check with no stored regressions has nothing to replay: no item, rather than a placeholder skip.
    empty = [i for i in items if "regression" in getattr(i, "fixturenames", ()) and
             any("empty parameter set" in str(m.kwargs.get("reason", "")) for m in i.iter_markers("skip"))]
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [i for i in items if i not in empty]
    # Stored regressions (explicit examples) first, then the checks that launch no kernel: a wrong split is found
    # and shrunk cheaply before any kernel check meets it. Of the kernel checks the oracle goes first: its items are
    # the longest (one per release, float64), and started last they ran alone at the end of a GPU run.
    def order(item: pytest.Item) -> int:
        if "regression" in getattr(item, "fixturenames", ()):
            return 0
        check = getattr(getattr(item, "module", None), "CHECK", "")
        return 1 if check not in KERNEL_CHECKS else 2 if check == "oracle" else 3

    items.sort(key=order)


def _device_kind(device: str) -> str:
    return device.split(":")[0]


def load_regressions(directory: Path, check: str) -> list[tuple[Example, object, str, str]]:
    """(example, extra, target label, digest) of every kept failing example of `check` found on this kind of device
    (a GPU-sized example is not replayed by the CPU interpreter)."""
    out = []
    for path in sorted(directory.glob(f"{check}-*.json")):
        body = json.loads(path.read_text())
        if body.get("device", _device_kind(DEVICE)) != _device_kind(DEVICE):
            continue
        ex = Example.from_json(json.dumps(body["example"]))
        label = body["geometry"] if body["geometry"] != ex.contract.name else ""
        out.append((ex, body.get("extra"), label, path.stem.split("-")[-1]))
    return out


# ---- running checks ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    word: str
    diagnosis: str = ""


class Verdict(Exception):
    """Raised out of a check by a subject call that failed: it is the subject's outcome, not a harness bug."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.diagnosis)
        self.outcome = outcome


class NotRun(Exception):
    """Raised out of a kernel check whose example the subject's split already gets wrong (the reason)."""


class Poisoned(BaseException):
    """A subject's call left this process's device unusable. A BaseException so that hypothesis does not shrink
    (every further call would fail too): the runner records the example and ends the process."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.diagnosis)
        self.outcome = outcome


@dataclass(frozen=True)
class Prepared:
    """An example made concrete: token tensors, the release's kv_cache holding them, and its page table."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: torch.Tensor
    paging: Paging


@dataclass
class _ItemState:
    ran: int = 0
    not_run: set[str] = field(default_factory=set)
    unsupported: set[str] = field(default_factory=set)
    known: dict[str, findings.Finding] = field(default_factory=dict)
    failure: tuple[Example, object, Outcome] | None = None


class Runner:
    """Runs one check over hypothesis-drawn examples of one target and records what happened."""

    recorded = 0  # result lines this process wrote

    def __init__(self, session: Session, request: pytest.FixtureRequest):
        self.s = session
        self.subject = session.subject
        self.request = request
        self.max_examples = request.config.getoption("max_examples")
        self.device = DEVICE

    # helpers for the checks
    def prepare(self, ex: Example) -> Prepared:
        """Tokens written where the release's contract says (what vLLM's cache write does), pages poisoned."""
        q, k, v = ex.case.inputs(DEVICE)
        kv_cache = ex.contract.allocate(ex.dims, ex.case.torch_dtype, DEVICE)
        keys, values = ex.contract.split(kv_cache, ex.dims)
        pages = ex.paging().to(DEVICE)
        write(keys, values, pages, k, v)
        return Prepared(q, k, v, kv_cache, pages)

    @staticmethod
    def outcome(word: str, diagnosis: str = "") -> Outcome:
        return Outcome(word, diagnosis)

    @staticmethod
    def compare(actual: torch.Tensor, expected: torch.Tensor, what: str) -> Outcome:
        """bit-identical, or differs with the harness.compare diagnosis."""
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            return Outcome("differs", f"{what}: {tuple(actual.shape)} {actual.dtype} vs "
                                      f"{tuple(expected.shape)} {expected.dtype}")
        d = diagnose(actual, expected)
        return Outcome("bit-identical") if d is None else Outcome("differs", f"{what}: not bit-identical: {d}")

    def call(self, fn, *args):
        """Call into the subject; its ContractError is a contract-error, anything else it raises a subject-error.
        On CUDA the call is waited for, so that a fault of the subject's kernel is reported against this call."""
        try:
            out = fn(*args)
            if self.device.startswith("cuda"):
                torch.cuda.synchronize(self.device)
            return out
        except ContractError as e:
            raise Verdict(Outcome("contract-error", f"{type(e).__name__}: {e}")) from e
        except Exception as e:
            why = devices.poisoned(self.device)
            if why:
                raise Poisoned(Outcome("subject-error", f"{type(e).__name__}: {e}; {POISONED} ({why})")) from e
            raise Verdict(Outcome("subject-error", f"{type(e).__name__}: {e}")) from e

    def split(self, p: Prepared, ex: Example) -> tuple[torch.Tensor, torch.Tensor]:
        """The subject's K and V views of the prepared cache, for a kernel check. NotRun when they do not read the
        tokens written where the contract says: kernels over them could only restate split-agrees' finding."""
        got = self.call(self.subject.split, p.kv_cache, ex.contract)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            raise NotRun(f"the subject's split returned {type(got).__name__}, not a (K, V) pair of tensors")
        want = ex.contract.split(p.kv_cache, ex.dims)
        for name, a, b in zip("KV", got, want):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise NotRun(f"the subject's {name} view is {tuple(a.shape)} {a.dtype}, the contract's "
                             f"{tuple(b.shape)} {b.dtype}")
        for name, a, b in zip("KV", read(*got, p.paging), (p.k, p.v)):
            if not torch.equal(bits(a), bits(b)):
                raise NotRun(f"the subject's {name} view does not read the tokens written through the contract's "
                             f"{name} view (split-agrees reports the split)")
        return got

    # running
    def run(self, target: Target, check: str, fn, extra: st.SearchStrategy = st.none(),
            needs_subject: bool = True, launches_kernels: bool = True) -> None:
        """Check `fn` over generated examples of `target`; red only on a new finding. A check that launches no
        kernel costs ~1/20 of one that does, so it gets CHEAP_FACTOR times the examples; a target of one sparsity
        mode gets its share of them."""
        state = _ItemState()
        strategy = examples([target.contract], SIZES, cases(SIZES, target.mode) if target.mode else None)
        count = (self.max_examples or settings.default.max_examples) * (1 if launches_kernels else CHEAP_FACTOR)
        if target.mode:
            count = -(-count // len(SPARSITY_MODES))

        @settings(max_examples=count)
        @given(ex=strategy, extra=extra)
        def generated(ex: Example, extra) -> None:
            self._one(target, check, fn, ex, extra, state, needs_subject)

        try:
            generated()
        except BaseException:
            self._keep_failure(target, check, state)
            raise
        self._settle(state)

    def replay(self, regression, check: str, fn, needs_subject: bool = True) -> None:
        """Run one stored regression example."""
        target, ex, extra, _ = regression
        state = _ItemState()
        try:
            self._one(target, check, fn, ex, extra, state, needs_subject)
        except BaseException:
            self._keep_failure(target, check, state)
            raise
        self._settle(state)

    def _one(self, target: Target, check: str, fn, ex: Example, extra, state: _ItemState,
             needs_subject: bool) -> None:
        reason = self.subject.supports(ex.case) if needs_subject else None
        if reason:
            state.unsupported.add(reason)
            if state.failure is None:
                self._record(target, check, ex, extra, Outcome("unsupported", reason))
            return
        try:
            outcome = fn(self, ex, extra)
        except Verdict as v:
            outcome = v.outcome
        except NotRun as e:
            state.not_run.add(str(e))
            if state.failure is None:
                self._record(target, check, ex, extra, Outcome("not-run", str(e)))
            return
        except Poisoned as p:
            self._end_process(target, check, ex, extra, p.outcome)
        except Exception as e:
            state.failure = (ex, extra, Outcome("harness-error", f"{type(e).__name__}: {e}"))
            raise
        state.ran += 1
        known = None
        if outcome.word not in results.PASSING:
            known = findings.match(self.s.findings, target.release.release, target.geometry,
                                   ex.case.sparsity.mode, check, outcome.word)
            if known is None:
                state.failure = (ex, extra, outcome)
                raise AssertionError(f"{outcome.word}: {outcome.diagnosis}\n{self.repro(target, check, ex, extra)}")
            state.known[known.id] = known
        if state.failure is None:  # examples tried while shrinking a failure are not results
            self._record(target, check, ex, extra, outcome, known.id if known else "")

    def _end_process(self, target: Target, check: str, ex: Example, extra, outcome: Outcome) -> None:
        """Record the example that poisoned the device and end this process: under xdist a fresh worker takes
        the remaining items (and this item is reported as its crash); alone, the session stops."""
        self._record(target, check, ex, extra, outcome)
        self._keep_regression(target, check, ex, extra)
        message = f"kvconform {outcome.word}: {outcome.diagnosis}\n{self.repro(target, check, ex, extra)}"
        print(message, file=sys.__stderr__, flush=True)
        if WORKER:
            os._exit(3)
        pytest.exit(message + "\nrun with xdist (-n) to go on in a fresh process after such a fault", returncode=1)

    def _keep_failure(self, target: Target, check: str, state: _ItemState) -> None:
        # The last failing example seen is the shrunk one hypothesis reports; other errors (a deadline, say)
        # propagate as they are.
        if state.failure is not None:
            ex, extra, outcome = state.failure
            self._record(target, check, ex, extra, outcome)
            self._keep_regression(target, check, ex, extra)

    def _settle(self, state: _ItemState) -> None:
        if state.known:
            pytest.xfail("; ".join(f"known finding {f.id}: {f.outcome} ({f.reason}; {f.link})"
                                   for f in state.known.values()))
        if state.not_run:
            pytest.skip(f"not run on {'; '.join(sorted(state.not_run))}")
        if state.ran == 0 and state.unsupported:
            pytest.skip(f"{self.s.subject_name} supports none of the examples: {'; '.join(sorted(state.unsupported))}")

    def repro(self, target: Target, check: str, ex: Example, extra) -> str:
        """ONE line that reproduces a failing example: what it is, and the command that replays it."""
        node = self.request.node.nodeid.split("[")[0].removesuffix("_regression") + "_regression"
        return (f"REPRO {check} release={target.release.release} ({target.release.source}) "
                f"geometry={target.geometry} layers={ex.num_layers}/{ex.layer} num_blocks={ex.num_blocks} "
                f"pages={ex.page_order}/{ex.page_seed} extra={extra!r} {ex.case!r} :: "
                f"pytest {node} {self.s.args} -k {ex.digest()}")

    def _keep_regression(self, target: Target, check: str, ex: Example, extra) -> None:
        d = self.s.regressions_dir / self.s.subject_name
        d.mkdir(parents=True, exist_ok=True)
        body = {"check": check, "subject": self.s.subject_name, "release": target.release.release,
                "geometry": target.geometry, "example": json.loads(ex.to_json()), "extra": extra,
                "case": repr(ex.case), "device": _device_kind(self.device)}
        (d / f"{check}-{ex.digest()}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")

    def _record(self, target: Target, check: str, ex: Example, extra, outcome: Outcome, known: str = "") -> None:
        results.append(self.s.results_dir, results.Result(
            target.release.release, target.release.source, self.s.subject_name, target.geometry, check,
            ex.case.sparsity.mode, outcome.word, ex.digest(),
            self.repro(target, check, ex, extra) if outcome.word not in results.PASSING else "",
            outcome.diagnosis, known, self.device), self.s.worker)
        Runner.recorded += 1

    def record_target(self, target: Target, check: str, outcome: Outcome) -> None:
        """Record an outcome of a whole (release, geometry) item, e.g. a check that cannot run here."""
        results.append(self.s.results_dir, results.Result(
            target.release.release, target.release.source, self.s.subject_name, target.geometry, check, "*",
            outcome.word, diagnosis=outcome.diagnosis, device=self.device), self.s.worker)
        Runner.recorded += 1

    def record_release(self, r: ReleaseContracts, check: str, outcome: Outcome) -> str:
        """Record a whole-release outcome (contracts unreadable, drift); the known finding's id if one predicts it."""
        known = findings.match(self.s.findings, r.release, "*", "*", check, outcome.word)
        results.append(self.s.results_dir, results.Result(r.release, r.source, self.s.subject_name, "*", check, "*",
                                                          outcome.word, diagnosis=outcome.diagnosis,
                                                          known=known.id if known else ""), self.s.worker)
        return known.id if known else ""


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> Runner:
    return Runner(request.config.kvconform, request)
