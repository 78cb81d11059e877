"""The conformance runner: (release contracts, subject, check, example) -> an outcome, recorded; no pytest in it.

A check is a function (runner, example, extra) -> Outcome. `Runner.run` draws examples of one target (a release
and one of its geometries) with hypothesis, records one result line per example (harness.results), matches what
does not pass against the subject's known findings, and on a new finding raises `NewFinding` with ONE line that
reproduces it; the shrunk example is kept under <regressions>/<subject>/ and replayed first by every later session.
Anything the subject returns or raises is the subject's outcome; `harness-error` is kept for kvconform's own bugs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import checks, compiles, devices, findings, fixtures, limits, matrix, profiles, results, vllm_api
from harness.checks import Check
from harness.cache import Paging, filled, read
from harness.cases import SPARSITY_MODES
from harness.compare import bits, diagnose
from harness.contract import Contract, ContractError, Dims, cache_dtype
from harness.fixtures import Recording
from harness.layer import Layer, in_force, layer_for
from harness.matrix import version_key
from harness.results import Word
from harness.strategies import CPU, GPU, Example, Sizes, alike, cases, examples, warmup_shards
from harness.subjects import DEFAULT_CAPABILITIES, FORWARD, capabilities_of, load_subject

POISONED = "the device is unusable after this call"


NOMINAL = Dims(num_blocks=8, block_size=16, kv_heads=2, head_dim=64)  # the sizes a layer is asked at per geometry


def sizes_for(device: str) -> Sizes:
    """The compile-time sets and size limits examples are drawn from on `device`."""
    return GPU if device.startswith("cuda") else CPU


# ---- the session: releases, their contracts, the subject ----------------------------------------------------


@dataclass(frozen=True)
class ReleaseContracts:
    """One release's contracts for this session, live (probed, with drift against the recording) or replayed."""

    release: str
    source: str  # "live" or "replay"
    contracts: tuple[Contract, ...]
    error: str = ""  # the contract-error when they could not be read
    drift: tuple[str, ...] = ()
    recording: Recording | None = field(default=None, compare=False, repr=False)  # replay: the stand-ins' source

    def describe(self) -> str:
        """How the contracts were read, and their distinct geometries by family, with the backends that hand them
        (every geometry by name: docs/contracts.md, or `python -m harness.fixtures table`)."""
        if self.error:
            return f"{self.release}: contract-error: {self.error}"
        how = "live probe of the installed vLLM" if self.source == "live" else "replay of the recorded fixture"
        kinds: dict[str, tuple[set[Contract], dict[str, None]]] = {}
        for c in self.contracts:
            kind = f"{c.family}{'+diffkv' if c.diff_kv else ''}{'' if c.cache_dtype == 'auto' else '@' + c.cache_dtype}"
            geometries, backends = kinds.setdefault(kind, (set(), {}))
            geometries.add(c)
            backends[c.origin.backend_name] = None
        return (f"{self.release}: {how}, {len(self.contracts)} contracts in {len(set(self.contracts))} geometries: "
                + ", ".join(f"{kind} x{len(g)} ({', '.join(b)})" for kind, (g, b) in kinds.items()))


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def load_release(release: str, contracts_dir: Path) -> ReleaseContracts:
    """The release's contracts: probed live when vLLM is installed (with drift against the recording), else
    replayed from the recording."""
    if not vllm_installed():
        try:
            recording = fixtures.load(release, contracts_dir)
            return ReleaseContracts(release, "replay", recording.contracts, recording=recording)
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


def releases_asked(asked: list[str], contracts_dir: Path) -> list[str]:
    """Release names from what was asked ('recorded' = every recording); the installed vLLM's when nothing was.
    ValueError (a usage error) when nothing was asked and vLLM is not installed."""
    if not asked:
        if not vllm_installed():
            raise ValueError("vLLM is not installed: name the release(s) to replay with --kvconform-release "
                             f"(recorded: {', '.join(fixtures.releases(contracts_dir))})")
        from harness.probe import release

        asked = [release()]
    names = [r for a in asked for r in (fixtures.releases(contracts_dir) if a == "recorded" else [a])]
    if not vllm_installed():
        recorded = fixtures.releases(contracts_dir)
        for name in names:
            if name not in recorded:
                raise ValueError(f"vllm {name} has no recording in {contracts_dir} (recorded: {', '.join(recorded)}); "
                                 f"to check it: {_how_to_record(name)}")
    return names


def _how_to_record(name: str) -> str:
    try:
        matrix.get(name)
    except matrix.UnknownRelease:
        return f"add it to kvconform's matrix.toml, then run `nox -s probe -- {name}` in a kvconform checkout"
    except OSError:  # an installed kvconform ships its recordings, not matrix.toml
        pass
    return f"run `nox -s probe -- {name}` in a kvconform checkout (or install vllm=={name} and run live)"


@dataclass
class Session:
    """What every check of one process shares."""

    subject_name: str
    subject_spec: str  # how it was named (load_subject): warm-up processes load it again by this
    subject: object
    releases: list[ReleaseContracts]
    findings: tuple[findings.Finding, ...]
    results_dir: Path
    regressions_dir: Path
    worker: str  # this process's name in result file names: <run>-<worker>
    args: str  # the options that select this session, for repro lines
    device: str
    warmup: compiles.Warmup | None = None
    workers: dict[str, dict] = field(default_factory=dict)  # xdist worker id -> what it reported at its end
    capabilities: frozenset[str] = DEFAULT_CAPABILITIES  # what the subject declares it can do (harness.subjects)
    backends: tuple[str, ...] = ()  # attention backends whose contracts are checked (empty: every recorded one)
    cache_dtypes: tuple[str, ...] = ()  # cache dtypes likewise
    run: str = ""  # the run's id (harness.results.new_run_id), in every line it writes
    seed: int = 0  # what every item's draws derive from (item_seed)
    say: Callable[[str], None] = field(default=lambda text: print(text, file=sys.__stderr__, flush=True), repr=False)
    warming: object = None  # the warm-up thread (controller), True in a worker whose controller started one
    warm_error: str = ""
    merged: dict[str, str] = field(default_factory=dict)  # release -> what merging its lines did (controller)

    def selects(self, c: Contract) -> bool:
        """Whether the session checks contract `c`: its backend and cache dtype were asked for, and the subject
        serves that backend (a subject's optional `backends`: a plugin of one backend meets no other's caches)."""
        served = getattr(self.subject, "backends", None)
        return ((not self.backends or c.origin.backend_name in self.backends)
                and (served is None or c.origin.backend_name in served)
                and (not self.cache_dtypes or c.cache_dtype in self.cache_dtypes))

    @property
    def sizes(self) -> Sizes:
        return sizes_for(self.device)

    def write(self, r: ReleaseContracts, geometry: str, check: str, sparsity: str, word: Word | str,
              diagnosis: str = "", contract: Contract | None = None, **fields) -> None:
        """Record one result line of this run: where every line of a session is built. With `contract`, the line
        says what the geometry is: the backends that hand it in this release, its cache dtype, family, physical
        order and layer arrangement."""
        if contract is not None:
            fields.update(backends=tuple(sorted({c.origin.backend_name for c in r.contracts if c == contract})),
                          cache_dtype=contract.cache_dtype, family=contract.family, order=".".join(contract.physical),
                          layers="cross-layer" if contract.shared else "per-layer")
        results.append(self.results_dir, results.Result(
            run=self.run, release=r.release, source=r.source, subject=self.subject_name, geometry=geometry,
            check=check, sparsity=sparsity, outcome=word, diagnosis=diagnosis, **fields), self.worker)
        Runner.recorded += 1

    def warm_contracts(self) -> list[Contract]:
        """One selected geometry per K/V element type that the subject reads: of a geometry, a kernel variant
        depends on that alone (shapes, strides and offsets are runtime values; tests/test_compiles.py checks this
        against the launches of drawn examples)."""
        by_type: dict[object, Contract] = {}
        for t in targets(self, checks.BIT_IDENTITY):
            if self.supports(t.release, t.contract) is None:
                by_type.setdefault(t.contract.dtype.view, t.contract)
        return list(by_type.values())

    def supports(self, r: ReleaseContracts, c: Contract, dims: Dims = NOMINAL, dtype: torch.dtype = torch.bfloat16
                 ) -> str | None:
        """Why the subject cannot read release `r`'s caches of `c` (its own word), None when it can."""
        return supports_layer(self.subject, self.subject_name, layer_of(r, c, dims, dtype), self.capabilities)

    def coverage(self) -> list[str]:
        """Per release, what of its recorded contracts this run checks and what it leaves out, with counts and why
        (the backends and cache dtypes asked for, the subject's own `backends`, caches no K/V check takes, what
        its supports_layer refuses); then the checks the subject declares no capability for."""
        served = getattr(self.subject, "backends", None)
        out = []
        for r in self.releases:
            left: dict[str, list[Contract]] = {}
            for c in r.contracts:
                b = c.origin.backend_name
                why = ("not asked for (--kvconform-backend)" if self.backends and b not in self.backends else
                       f"not among the backends {self.subject_name} names ({', '.join(served)})"
                       if served is not None and b not in served else
                       "cache dtype not asked for (--kvconform-cache-dtype)"
                       if self.cache_dtypes and c.cache_dtype not in self.cache_dtypes else "")
                if why:
                    left.setdefault(why, []).append(c)
            chosen = dict.fromkeys(t.contract for t in targets(self) if t.release is r)
            kernels = FORWARD in self.capabilities
            outside: dict[str, list[str]] = {}
            for c in dict.fromkeys(c for c in r.contracts if self.selects(c)):
                reason = _outside(c, self.sizes) or (_outside(c, self.sizes, checks.BIT_IDENTITY) if kernels else "")
                if reason:
                    outside.setdefault(reason, []).append(c.name)
            refused: dict[str, list[str]] = {}
            for c in chosen:
                reason = self.supports(r, c)
                if reason:
                    refused.setdefault(reason, []).append(c.name)
            checked = sum(1 for c in r.contracts if self.selects(c))
            parts = [f"{_counted(len(cs), 'contract')} of {_count_by(c.origin.backend_name for c in cs)}: {why}"
                     for why, cs in left.items()]
            parts += [f"{_counted(len(names), 'geometry')} ({_listed(names)}): {reason}"
                      for reason, names in outside.items()]
            parts += [f"{_counted(len(names), 'geometry')} ({_listed(names)}): unsupported, by its supports_layer: "
                      f"{reason}" for reason, names in refused.items()]
            line = (f"{r.release}: {self.subject_name} selects {checked} of its {len(r.contracts)} contracts "
                    f"({_counted(len(chosen), 'geometry')})")
            out.append(line + ("; not checked: " + "; ".join(parts) if parts else "; every one is checked"))
        lacking = [c.name for c in checks.CHECKS if c.module and c.needs and missing(self, c.needs)]
        if lacking:
            out.append(f"{self.subject_name} declares {', '.join(sorted(self.capabilities))}: {', '.join(lacking)} "
                       "need more (one not-applicable line per release each)")
        return out

    def warm_behind(self, gpus: list[str], processes: int) -> bool:
        """Start the warm-up in a thread of this process and return at once (False when there is nothing to warm):
        the checks that launch no kernel run meanwhile; kernel items first wait for its end (`await_warmup`)."""
        if FORWARD not in self.capabilities or not self.warm_contracts():
            return False

        def body() -> None:
            try:
                self.warm(gpus, processes)
                what = self.warmup.describe() if self.warmup else "nothing to warm"
            except BaseException as e:  # noqa: BLE001 - a warm-up never decides an outcome; the examples do
                what = f"warm-up failed ({type(e).__name__}: {e}): examples compile what they need"
                self.warm_error = what
            compiles.warm_ended(self.run, what)

        self.warming = threading.Thread(target=body, name="kvconform-warmup", daemon=True)
        self.warming.start()
        return True

    def await_warmup(self, limit: float) -> None:
        """Wait for this run's warm-up to end, where one was started (by this process or the run's controller)."""
        if self.warming is not None:
            compiles.await_warmup(self.run, limit)

    def warm(self, gpus: list[str], processes: int) -> compiles.Warmup | None:
        """Compile every kernel variant this session's examples can draw, before the first (see harness.compiles)."""
        contracts = self.warm_contracts()
        if not contracts or FORWARD not in self.capabilities:  # a consumer launches no kernel
            return None
        shards = warmup_shards(self.sizes)
        self.warmup = compiles.warm(self.subject_spec, shards, contracts, gpus, processes,
                                    compiles.fingerprint(self.subject, shards, contracts, gpus))
        return self.warmup

    def process_report(self) -> dict:
        """This process's device, compiles, loads and result lines, as the run summary keeps them."""
        c = compiles.counts()
        return {"device": self.device, "compiled": c.compiled, "loaded": c.loaded, "results": Runner.recorded}

    def culprit(self, worker: str) -> str:
        """What ended a crashed xdist worker, when it was the device: its last result line, the example that
        poisoned the device, with its repro ("" otherwise)."""
        files = self.results_dir.glob(f"*/results.{self.run}-{worker}.jsonl")
        last = [json.loads(line) for f in sorted(files, key=lambda f: f.stat().st_mtime)
                for line in f.read_text().splitlines()[-1:]]
        if last and POISONED in last[-1]["diagnosis"]:
            return f"{last[-1]['outcome']}: {last[-1]['diagnosis']}\n{last[-1]['repro']}"
        return ""

    def write_run(self) -> None:
        """results/run.json: the subject, releases, warm-up and every process's report."""
        self.results_dir.mkdir(parents=True, exist_ok=True)
        warm = None
        if self.warmup:
            warm = {**vars(self.warmup), "counts": vars(self.warmup.counts), "errors": list(self.warmup.errors)}
        (self.results_dir / "run.json").write_text(json.dumps({
            "subject": self.subject_name, "releases": [r.release for r in self.releases], "warmup": warm,
            "processes": self.workers}, indent=1) + "\n")

    def merge(self) -> None:
        """Merge this run's per-process result files per release (what each merge did goes to the summary), then
        mark the known findings that did not happen in this run."""
        for r in self.releases:
            if results.release_dir(self.results_dir, r.release).is_dir():
                merged = results.merge(self.results_dir, r.release, self.run + "-")
                if merged.added:
                    self.merged[r.release] = str(merged)
                    self._mark_stale(r)

    def _mark_stale(self, r: ReleaseContracts) -> None:
        # Done on merged results: with xdist a finding may apply on one worker and happen on another. This run's lines
        # only: the lines an earlier run left (items not re-checked) say nothing of what happened in this one.
        rows = [x for x in results.read(self.results_dir, r.release)
                if x.subject == self.subject_name and x.run == self.run]
        happened = {x.known for x in rows if x.known}
        for f in self.findings:
            applied = any(f.applies(x.release, x.geometry, x.sparsity, x.check) and x.outcome != Word.UNSUPPORTED
                          for x in rows)
            if applied and f.id not in happened:
                results.append(self.results_dir, results.Result(
                    run=self.run, release=r.release, source=r.source, subject=self.subject_name, geometry=f.geometry,
                    check=f.check, sparsity=f.sparsity, outcome=Word.STALE, known=f.id,
                    diagnosis=f"known finding {f.id} ({f.outcome}: {f.reason}) applied but did not happen"))

    def summary(self, slowest: int = 3) -> list[str]:
        """One line per process and per release, of this run's result lines only ("not run" for a release it
        recorded nothing of), stale known findings, and the `slowest` examples of each check with their times."""
        lines = [f"kvconform run {self.run}"] + ([f"kvconform {self.warmup.describe()}"] if self.warmup else [])
        lines += [f"kvconform {self.warm_error}"] if self.warm_error else []
        for name, w in sorted(self.workers.items()):
            lines.append(f"kvconform process {name} on {w['device']}: {w['results']} results; kernels "
                         f"{w['compiled']} compiled, {w['loaded']} loaded from the disk cache" if w else
                         f"kvconform process {name}: ended without reporting (crashed or killed)")
        ran: list[results.Result] = []
        for r in self.releases:
            path = results.release_dir(self.results_dir, r.release) / "results.jsonl"
            rows = [x for x in (results.read(self.results_dir, r.release) if path.exists() else [])
                    if x.run == self.run]
            if all(x.outcome == Word.NOT_APPLICABLE for x in rows):
                na = f"; {len(rows)} not-applicable" if rows else ""
                lines.append(f"kvconform {r.release} ({r.source}) {self.subject_name}: not run (this run checked "
                             f"nothing of it{na})")
                continue
            ran += rows
            counts: dict[str, int] = {}
            for x in rows:
                counts[x.outcome.value] = counts.get(x.outcome.value, 0) + 1
            lines.append(f"kvconform {r.release} ({r.source}) {self.subject_name}: "
                         + ", ".join(f"{n} {word}" for word, n in sorted(counts.items())) + f" -> {path}")
            lines += [f"  merged: {self.merged[r.release]}"] if r.release in self.merged else []
            lines += [f"  STALE {x.known}: {x.diagnosis}" for x in rows if x.outcome == results.STALE]
        lines += [f"kvconform {line}" for line in self.coverage()]
        by_check: dict[str, list[results.Result]] = {}
        for x in ran:
            if x.seconds:
                by_check.setdefault(x.check, []).append(x)
        for check, rows in sorted(by_check.items()):
            top = sorted(rows, key=lambda x: -x.seconds)[:slowest]
            lines.append(f"kvconform slowest {check}: " + "; ".join(
                f"{x.seconds:.2f} s {x.release} {x.geometry} {x.case} ({x.outcome.value})" for x in top))
        return lines


def start(subject_spec: str, asked: list[str], contracts_dir: Path, results_dir: Path, regressions_dir: Path,
          known_findings_dir: Path, device: str, worker: str, args: str, backends: tuple[str, ...] = (),
          cache_dtypes: tuple[str, ...] = (), run: str = "") -> Session:
    """The session of one process. ValueError (a usage error) for a subject, releases, backends or cache dtypes
    that cannot be named."""
    names = releases_asked(asked, contracts_dir)
    subject = load_subject(subject_spec)
    caps = capabilities_of(subject)
    known = findings.load(subject.name, known_findings_dir)
    releases = [load_release(r, contracts_dir) for r in names]
    recorded = {c.origin.backend_name for r in releases for c in r.contracts}
    unknown = sorted(set(backends) - recorded)
    if unknown:
        raise ValueError(f"backend(s) {', '.join(unknown)} not among the session releases' contracts "
                         f"({', '.join(sorted(recorded))})")
    return Session(subject.name, subject_spec, subject, releases, known, results_dir, regressions_dir, worker, args,
                   device, run=run, seed=run_seed(run), capabilities=caps, backends=tuple(backends),
                   cache_dtypes=tuple(cache_dtype(n).name for n in cache_dtypes))




def _count_by(names) -> str:
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{n} ({k})" for n, k in counts.items())


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


def _listed(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f", ... {len(names) - shown} more" if len(names) > shown else "")


def run_seed(run: str) -> int:
    """The seed of a run's draws: --hypothesis-seed when given, 0 under a derandomized profile (ci, find), else one
    taken from the run's id (the header prints it: --hypothesis-seed=N draws the same examples again)."""
    if hypothesis.core.global_force_seed is not None:
        return int(hypothesis.core.global_force_seed)
    if settings.default.derandomize:
        return 0
    return int(hashlib.sha1(run.encode()).hexdigest()[:8], 16)


def item_seed(seed: int, check: str, target: Target) -> int:
    """The seed of one item's draws: from the run's seed, the check and the (release, geometry, sparsity mode) alone,
    so that an item draws the same examples whether its release is installed or replayed, whatever the subject,
    and items of one run draw different ones."""
    key = f"{seed}|{check}|{target.release.release}|{target.geometry}|{target.mode}"
    return int(hashlib.sha1(key.encode()).hexdigest()[:16], 16)


def examples_per_item(check: Check, max_examples: int, mode: str = "") -> int:
    """Generated examples of one item of `check` (its explicit ones come on top): the profile's max_examples times
    the check's budget, shared out among the sparsity modes when its items take one mode each (the oracle's)."""
    count = max_examples * check.budget
    return -(-count // len(SPARSITY_MODES)) if mode else count


def plan(session: Session, max_examples: int) -> str:
    """The examples each geometry gets per check in this session, as the items will draw them."""
    sample = next(iter(targets(session)), None)
    parts = []
    for c in checks.CHECKS:
        if not c.module or c.name == checks.CONTRACTS.name or missing(session, c.needs):
            continue
        if c.name == checks.ORACLE.name:
            parts.append(f"{c.name} {examples_per_item(c, max_examples, 'none')} in each of {len(SPARSITY_MODES)} "
                         "sparsity modes, once per session")
            continue
        explicit = len(checks.resolve(c.explicit)(sample.contract, session.sizes)) if c.explicit and sample else 0
        parts.append(f"{c.name} {examples_per_item(c, max_examples)}" + (f" + {explicit} explicit" if explicit else "")
                     + (" (vLLM's own CUDA op: live on CUDA only)" if c.launches == "vllm" else ""))
    return "; ".join(parts)


def layer_of(r: ReleaseContracts, contract: Contract, dims: Dims, dtype: torch.dtype) -> Layer:
    """The layer value a subject gets for release `r`'s cache of `contract` at `dims`: the backend `contract` was
    read from, vLLM's class live, the recorded stand-in in replay."""
    backend = vllm_api.backend_class(r.recording or r.release, contract.origin.backend_name)
    return layer_for(contract, dims, dtype, backend, r.release, r.recording)


def supports_layer(subject: object, name: str, layer: Layer, capabilities: frozenset[str]) -> str | None:
    """Why `subject` cannot read `layer`'s cache, None when it can. Optional in a subject: a consumer (no forward)
    that says nothing meets every cache; a kernel that says nothing is taken to read model-dtype K/V only, so a
    quantised cache is unsupported for it (never a pass, never a finding) until it declares otherwise."""
    hook = getattr(subject, "supports_layer", None)
    if hook is not None:
        with in_force(layer):
            return hook(layer)
    if FORWARD in capabilities and layer.cache_dtype != "auto":
        return (f"{name} declares no supports_layer: a kernel is taken to read model-dtype K/V only, not a "
                f"{layer.cache_dtype} cache")
    return None


def missing(session: Session, needs: frozenset[str] | set[str]) -> list[str]:
    """The capabilities a check needs that the session's subject does not declare (empty: the check applies)."""
    return sorted(set(needs) - session.capabilities)


def record_not_applicable(session: Session, check: Check) -> int:
    """One not-applicable line per session release for a check the subject lacks capabilities for (never a pass,
    never a finding). Returns how many lines were written."""
    why = (f"{session.subject_name} declares {', '.join(sorted(session.capabilities))}; {check.name} needs "
           f"{', '.join(sorted(check.needs))} (missing {', '.join(missing(session, check.needs))})")
    for r in session.releases:
        session.write(r, "*", check.name, "*", Word.NOT_APPLICABLE, why)
    return len(session.releases)


# ---- targets and stored regressions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One release and one of its geometries; `label` names a check that uses no cache (the oracle's "dense"),
    `mode` the one sparsity mode its cases take (any when empty), `peer` the geometry of another layout setting of
    the same release and backend that the relayout check moves blocks into."""

    release: ReleaseContracts
    contract: Contract
    label: str = ""
    mode: str = ""
    peer: Contract | None = None

    @property
    def geometry(self) -> str:
        if self.peer is not None:
            return f"{self.contract.name}->{self.peer.name}"
        return self.label or self.contract.name

    @property
    def described(self) -> Contract | None:
        """The geometry its result lines describe (none for a check that uses no cache; a relayout's source)."""
        return None if self.label else self.contract


def targets(session: Session, check: Check | None = None) -> list[Target]:
    """Every (release, geometry) of the session's backends and cache dtypes, one per distinct geometry (backends
    handing a layer the same geometry share it), K/V caches only (`outside`); diff-KV caches only for checks that
    launch no kernel (`check` None: every geometry some check takes). The relayout check's are pairs (peers)."""
    if check is checks.RELAYOUT:
        return relayout_targets(session)
    return [Target(r, c) for r in session.releases
            for c in dict.fromkeys(c for c in r.contracts
                                   if session.selects(c) and not _outside(c, session.sizes, check))]


def relayout_targets(session: Session) -> list[Target]:
    """Pairs of geometries one release hands a layer of one backend, cache dtype and layer arrangement under two
    layout settings (VLLM_KV_CACHE_LAYOUT NHD/HND, or KVCacheLayout members): each geometry of such a group is the
    source of one pair and the target of another (the group in a cycle), a pair several backends share once."""
    out: list[Target] = []
    for r in session.releases:
        groups: dict[tuple, dict[Contract, None]] = {}
        for c in r.contracts:
            if session.selects(c) and not _outside(c, session.sizes):
                groups.setdefault((c.origin.backend_name, c.cache_dtype, c.shared), {})[c] = None
        pairs: dict[tuple[Contract, Contract], None] = {}
        for group in groups.values():
            ring = list(group)
            for i, c in enumerate(ring if len(ring) > 1 else ()):
                pairs.setdefault((c, ring[(i + 1) % len(ring)]), None)
        out += [Target(r, a, peer=b) for a, b in pairs]
    return out


def _outside(c: Contract, sizes: Sizes, check: Check | None = None) -> str:
    if c.latent:
        return "a latent (MLA) cache holds no K/V pair for a K/V subject to split"
    if c.diff_kv and check is not None and check.kernels:
        drawn = " or ".join(f"K {k} / V {v}" for k, v in sizes.diff_kv_dims)
        return (f"the subject's forwards take one head size for K and V, while a diff-KV cache has two (its examples "
                f"draw head sizes {drawn}): no forward check takes it")
    return ""


def record_outside(session: Session) -> int:
    """One not-applicable line per release for the selected geometries no K/V check covers, saying why."""
    n = 0
    for r in session.releases:
        why: dict[str, list[str]] = {}
        kernels = FORWARD in session.capabilities
        for c in dict.fromkeys(c for c in r.contracts if session.selects(c)):
            reason = _outside(c, session.sizes) or (_outside(c, session.sizes, checks.BIT_IDENTITY) if kernels else "")
            if reason:
                why.setdefault(reason, []).append(c.name)
        if why:
            text = "; ".join(f"{len(names)} geometries ({', '.join(names)}): {reason}" for reason, names in why.items())
            session.write(r, "*", checks.KV_CHECKS.name, "*", Word.NOT_APPLICABLE, text)
            n += 1
    return n


def dense_targets(session: Session) -> list[Target]:
    """The dense forward alone, which no release changes: once per session, under its newest release (a nox
    session holds one), one target per sparsity mode so that the float64 items run side by side."""
    newest = max((r for r in session.releases if r.contracts), key=lambda r: version_key(r.release), default=None)
    return [Target(newest, newest.contracts[0], "dense", m) for m in SPARSITY_MODES] if newest else []


@dataclass(frozen=True)
class Regression:
    """A kept failing example, bound to one release of the session that has its geometry."""

    target: Target
    example: Example
    extra: object
    digest: str


def regressions(session: Session, check: str) -> list[Regression]:
    """Every kept failing example of `check` found on this kind of device (a GPU-sized example is not replayed by
    the CPU interpreter), bound to each session target of the check with its geometry (that release's own contract
    of it: its layer is that release's setting and backend), or, for a check that uses no cache, to each session
    release with the example's geometry."""
    out = []
    by_geometry: dict[str, list[Target]] = {}
    for t in targets(session, checks.get(check)):
        by_geometry.setdefault(t.geometry, []).append(t)
    for path in sorted((session.regressions_dir / session.subject_name).glob(f"{check}-*.json")):
        body = json.loads(path.read_text())
        if body.get("device", _device_kind(session.device)) != _device_kind(session.device):
            continue
        ex = Example.from_json(json.dumps(body["example"]))
        digest = path.stem.split("-")[-1]
        if body["geometry"] in by_geometry or body["geometry"] == ex.contract.name:
            out += [Regression(t, ex, body.get("extra"), digest) for t in by_geometry.get(body["geometry"], [])]
            continue
        own = {r.release: next((c for c in r.contracts if c.name == ex.contract.name), None) for r in session.releases}
        out += [Regression(Target(r, own[r.release], body["geometry"]), ex, body.get("extra"), digest)
                for r in session.releases if own[r.release] is not None]
    return out


def order(check: Check, regression: bool) -> int:
    """Where an item of `check` runs: stored regressions first, then by the check's declared order (the checks
    that launch no kernel first: a wrong split is found and shrunk cheaply before any kernel check meets it)."""
    return 0 if regression else check.order


def _device_kind(device: str) -> str:
    return device.split(":")[0]


# ---- running checks ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    word: Word
    diagnosis: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "word", Word(self.word))  # an unknown word is a ValueError here, not a result


class Verdict(Exception):
    """Raised out of a check by a subject call that failed: it is the subject's outcome, not a harness bug."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.diagnosis)
        self.outcome = outcome


class NotRun(Exception):
    """Raised out of a kernel check whose example the subject's split already gets wrong (the reason)."""


class Poisoned(BaseException):
    """A subject's call left this process's device unusable. A BaseException so that hypothesis does not shrink
    (every further call would fail too)."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.diagnosis)
        self.outcome = outcome


class NewFinding(AssertionError):
    """An outcome no known finding predicts; its message ends with the REPRO line."""


class TimedOut(Exception):
    """An item ran past its time limit (harness.limits): recorded as `timeout` with the example it was running."""


class DeviceLost(BaseException):
    """The device of this process is unusable; the example is recorded and kept. Whoever runs the process ends it."""


@dataclass(frozen=True)
class Prepared:
    """An example made concrete: token tensors (k and v as the cache stores them, the dense forward's input), the
    release's kv_cache holding them, and its page table."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: torch.Tensor
    paging: Paging


@dataclass
class Settled:
    """How an item ended when it found nothing new: the known findings that happened, reasons examples were not
    run, reasons the subject gave for not supporting them, and how many ran."""

    ran: int = 0
    not_run: set[str] = field(default_factory=set)
    unsupported: set[str] = field(default_factory=set)
    known: dict[str, findings.Finding] = field(default_factory=dict)
    failure: tuple[Example, object, Outcome] | None = None


class Runner:
    """Runs one check over hypothesis-drawn examples of one target and records what happened. `replay_command`
    is the command that replays one kept example of this check (the REPRO line appends `-k <digest>`)."""

    recorded = 0  # result lines this process wrote

    def __init__(self, session: Session, replay_command: str, max_examples: int | None = None, item: str = "",
                 timeout: float = 0.0):
        self.s = session
        self.subject = session.subject
        self.replay_command = replay_command
        self.max_examples = max_examples
        self.device = session.device
        self.item = item or replay_command  # what a timeout names
        self.timeout = timeout  # seconds an item may run (0: no limit)
        self._running: tuple[Target, str, Example, object] | None = None

    # helpers for the checks
    def prepare(self, ex: Example) -> Prepared:
        """Tokens written where the release's contract says (what vLLM's cache write does), pages poisoned."""
        q, k, v = ex.inputs(self.device)
        k, v = ex.contract.dtype.stored(k), ex.contract.dtype.stored(v)
        pages = ex.paging().to(self.device)
        return Prepared(q, k, v, filled(ex.contract, ex.dims, pages, k, v), pages)

    @staticmethod
    def outcome(word: Word | str, diagnosis: str = "") -> Outcome:
        return Outcome(word, diagnosis)

    @staticmethod
    def compare(actual: torch.Tensor, expected: torch.Tensor, what: str) -> Outcome:
        """bit-identical, or differs with the harness.compare diagnosis."""
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            return Outcome(Word.DIFFERS, f"{what}: {tuple(actual.shape)} {actual.dtype} vs "
                                         f"{tuple(expected.shape)} {expected.dtype}")
        d = diagnose(actual, expected)
        return Outcome(Word.BIT_IDENTICAL) if d is None else Outcome(Word.DIFFERS, f"{what}: not bit-identical: {d}")

    def layer(self, ex: Example) -> Layer:
        """The layer value of the running example's cache: what its release hands a layer."""
        target = self._running[0]
        return layer_of(target.release, target.contract, ex.dims, ex.case.torch_dtype)

    def peer(self, ex: Example) -> tuple[Contract, Layer]:
        """The running relayout target's second geometry and the layer its release hands with it."""
        target = self._running[0]
        return target.peer, layer_of(target.release, target.peer, ex.dims, ex.case.torch_dtype)

    def call(self, fn, *args):
        """Call into the subject; its ContractError is a contract-error, anything else it raises a subject-error.
        A call handed a layer runs with that layer's release in force (harness.layer.in_force). On CUDA the call
        is waited for, so that a fault of the subject's kernel is reported against this call."""
        layer = next((a for a in args if isinstance(a, Layer)), None)
        try:
            with in_force(layer) if layer is not None else contextlib.nullcontext():
                out = fn(*args)
            if self.device.startswith("cuda"):
                torch.cuda.synchronize(self.device)
            return out
        except ContractError as e:
            raise Verdict(Outcome(Word.CONTRACT_ERROR, f"{type(e).__name__}: {e}")) from e
        except Exception as e:
            why = devices.poisoned(self.device)
            if why:
                raise Poisoned(Outcome(Word.SUBJECT_ERROR, f"{type(e).__name__}: {e}; {POISONED} ({why})")) from e
            raise Verdict(Outcome(Word.SUBJECT_ERROR, f"{type(e).__name__}: {e}")) from e

    def subject_split(self, kv_cache: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        """The subject's split of `kv_cache`: its (K, V) pair of tensors; anything else it returns is its
        subject-error, naming what it returned."""
        got = self.call(self.subject.split, kv_cache, layer)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            what = (f"a {type(got).__name__} of {len(got)} ({', '.join(type(t).__name__ for t in got)})"
                    if isinstance(got, (tuple, list)) else f"a {type(got).__name__}")
            raise Verdict(Outcome(Word.SUBJECT_ERROR, f"split of kv_cache {tuple(kv_cache.shape)} returned {what}, "
                                                      "not a (K, V) pair of tensors"))
        return got

    def split(self, p: Prepared, ex: Example) -> tuple[torch.Tensor, torch.Tensor]:
        """The subject's K and V views of the prepared cache, for a kernel check. NotRun when they do not read the
        tokens written where the contract says: kernels over them could only restate split-agrees' finding."""
        got = self.subject_split(p.kv_cache, self.layer(ex))
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
    def run(self, target: Target, check: Check, fn) -> Settled:
        """Check `fn` over generated examples of `target` as `check` declares them (harness.checks: its budget,
        strategies and explicit examples); raises NewFinding only on a new finding. A target of one sparsity mode
        gets its share of the examples."""
        state = Settled()
        sizes = self.s.sizes
        strategy = (checks.resolve(check.strategy)([target.contract], sizes) if check.strategy else
                    examples([target.contract], sizes, cases(sizes, target.mode) if target.mode else None))
        count = examples_per_item(check, self.max_examples or settings.default.max_examples, target.mode)

        @settings(max_examples=count)
        @given(ex=strategy, extra=checks.resolve(check.extra)() if check.extra else st.none())
        def generated(ex: Example, extra) -> None:
            self._one(target, check, fn, ex, extra, state)

        # Hypothesis runs the example attached last first: attached in reverse, they run in the order declared.
        for ex, value in reversed(checks.resolve(check.explicit)(target.contract, sizes) if check.explicit else []):
            generated = hypothesis.example(ex=ex, extra=value)(generated)
        generated = hypothesis.seed(item_seed(self.s.seed, check.name, target))(generated)

        return self._limited(target, check.name, state, generated)

    def replay(self, regression: Regression, check: Check, fn) -> Settled:
        """Run one stored regression example."""
        state = Settled()
        return self._limited(regression.target, check.name, state, lambda: self._one(
            regression.target, check, fn, regression.example, regression.extra, state))

    def _limited(self, target: Target, check: str, state: Settled, body) -> Settled:
        try:
            with limits.time_limit(self.timeout, self._hung), alike():
                body()
        except limits.ItemTimeout as e:
            raise TimedOut(self._record_timeout(str(e))) from None
        except BaseException:
            self._keep_failure(target, check, state)
            raise
        return state

    def _record_timeout(self, what: str) -> str:
        message = f"timeout: {self.item} {what} (a harness limit, --kvconform-timeout; not a verdict)"
        if self._running is None:
            self.s.write(self.s.releases[0], "*", "*", "*", Word.TIMEOUT, message, device=self.device)
            return message
        target, check, ex, extra = self._running
        repro = self.repro(target, check, ex, extra)
        self.s.write(target.release, target.geometry, check, ex.case.sparsity.mode, Word.TIMEOUT,
                     f"{message}; running example {ex.digest()}", target.described, case=ex.digest(), repro=repro,
                     device=self.device)
        return f"{message}\n{repro}"

    def _hung(self) -> None:
        # From the watchdog thread: the main thread is stuck where the alarm cannot reach it.
        message = self._record_timeout(f"ran past its limit of {self.timeout:g} s and did not return within "
                                       f"{min(limits.GRACE, self.timeout):g} s more: this process is ended")
        self.s.say(f"kvconform {message}")
        os._exit(3)

    def running(self, target: Target, check: str, ex: Example, extra) -> Runner:
        """This runner at one example of `target` (what `layer`, timeouts and repro lines speak of)."""
        self._running = (target, check, ex, extra)
        return self

    def _one(self, target: Target, check: Check, fn, ex: Example, extra, state: Settled) -> None:
        name = check.name
        self.running(target, name, ex, extra)
        start = time.perf_counter()
        try:
            reason = self.unsupported(check, ex)
            if reason:
                state.unsupported.add(reason)
                if state.failure is None:
                    self._record(target, name, ex, extra, Outcome(Word.UNSUPPORTED, reason))
                return
            outcome = fn(self, ex, extra)
        except Verdict as v:
            outcome = v.outcome
        except NotRun as e:
            state.not_run.add(str(e))
            if state.failure is None:
                self._record(target, name, ex, extra, Outcome(Word.NOT_RUN, str(e)))
            return
        except Poisoned as p:
            self._end_process(target, name, ex, extra, p.outcome)
        except Exception as e:
            state.failure = (ex, extra, Outcome(Word.HARNESS_ERROR, f"{type(e).__name__}: {e}"))
            raise
        state.ran += 1
        known = None
        if not outcome.word.passing:
            known = findings.match(self.s.findings, target.release.release, target.geometry,
                                   ex.case.sparsity.mode, name, outcome.word)
            if known is None:
                state.failure = (ex, extra, outcome)
                raise NewFinding(f"{outcome.word.value}: {outcome.diagnosis}\n{self._unshrunk()}"
                                 f"{self.repro(target, name, ex, extra)}")
            state.known[known.id] = known
        if state.failure is None:  # examples tried while shrinking a failure are not results
            self._record(target, name, ex, extra, outcome, known.id if known else "", time.perf_counter() - start)

    def _unshrunk(self) -> str:
        """Under a profile that does not shrink, the line that gets this item's shrunk example."""
        if profiles.shrinks():
            return ""
        return (f"the first failing example found, not shrunk ({settings.get_current_profile_name()}); the shrunk "
                f"one: pytest {shlex.quote(self.item)} {self.s.args} --hypothesis-profile=kvconform-ci\n")

    def unsupported(self, check: Check, ex: Example) -> str | None:
        """Why the subject does not take this example, by its own word (None when it does): a check that runs its
        forwards asks `supports(case)`, one that hands it a layer's cache asks `supports_layer(layer)`."""
        supports = getattr(self.subject, "supports", None)  # optional outside kernels
        reason = self.call(supports, ex.case) if check.asks_case and supports is not None else None
        if check.hands_cache and not reason:
            reason = self.call(supports_layer, self.subject, self.s.subject_name, self.layer(ex), self.s.capabilities)
        return reason

    def _end_process(self, target: Target, check: str, ex: Example, extra, outcome: Outcome) -> None:
        self._record(target, check, ex, extra, outcome)
        self._keep_regression(target, check, ex, extra)
        message = f"kvconform {outcome.word.value}: {outcome.diagnosis}\n{self.repro(target, check, ex, extra)}"
        print(message, file=sys.__stderr__, flush=True)
        raise DeviceLost(message)

    def _keep_failure(self, target: Target, check: str, state: Settled) -> None:
        # The last failing example seen is the shrunk one hypothesis reports; other errors (a deadline, say)
        # propagate as they are.
        if state.failure is not None:
            ex, extra, outcome = state.failure
            self._record(target, check, ex, extra, outcome)
            self._keep_regression(target, check, ex, extra)

    def repro(self, target: Target, check: str, ex: Example, extra) -> str:
        """ONE line that reproduces a failing example: what it is, and the command that replays it."""
        return (f"REPRO {check} release={target.release.release} ({target.release.source}) "
                f"geometry={target.geometry} layers={ex.num_layers}/{ex.layer} num_blocks={ex.num_blocks} "
                f"pages={ex.page_order}/{ex.page_seed} "
                + (f"head_dim_v={ex.head_dim_v} " if ex.head_dim_v else "") + f"extra={extra!r} {ex.case!r} :: "
                f"{self.replay_command} {self.s.args} -k {ex.digest()}")

    def _keep_regression(self, target: Target, check: str, ex: Example, extra) -> None:
        d = self.s.regressions_dir / self.s.subject_name
        d.mkdir(parents=True, exist_ok=True)
        body = {"check": check, "subject": self.s.subject_name, "release": target.release.release,
                "geometry": target.geometry, "example": json.loads(ex.to_json()), "extra": extra,
                "case": repr(ex.case), "device": _device_kind(self.device)}
        (d / f"{check}-{ex.digest()}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")

    def _record(self, target: Target, check: str, ex: Example, extra, outcome: Outcome, known: str = "",
                seconds: float = 0.0) -> None:
        self.s.write(target.release, target.geometry, check, ex.case.sparsity.mode, outcome.word, outcome.diagnosis,
                     target.described, case=ex.digest(), repro=self.repro(target, check, ex, extra) if not outcome.word.passing else "",
                     known=known, device=self.device, seconds=round(seconds, 4))

    def record_target(self, target: Target, check: Check, outcome: Outcome) -> None:
        """Record an outcome of a whole (release, geometry) item, e.g. a check that cannot run here."""
        self.s.write(target.release, target.geometry, check.name, "*", outcome.word, outcome.diagnosis,
                     target.described, device=self.device)

    def record_release(self, r: ReleaseContracts, check: Check, outcome: Outcome) -> str:
        """Record a whole-release outcome (contracts unreadable, drift); the known finding's id if one predicts it."""
        known = findings.match(self.s.findings, r.release, "*", "*", check.name, outcome.word.value)
        self.s.write(r, "*", check.name, "*", outcome.word, outcome.diagnosis, known=known.id if known else "")
        return known.id if known else ""
