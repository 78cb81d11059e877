"""The performance lane (`nox -s bench`, `python -m kvconform.bench`): per release and subject, the paged
forward's time over the dense forward's on every distinct geometry the releases hand the subject (each geometry
timed once, a line per release that hands it), at fixed workloads, judged against a noise band and the subject's
known performance findings (harness.results.timings: the lines and words; harness.results.findings: the known ones). A
new performance finding fails the lane, never a conformance check. CUDA only: an interpreted kernel's time says nothing
of a compiled one's.

A geometry is timed over the subject's own split of the release's kv_cache, once that split is the contract's K/V
views (else the cell is not timed: split-agrees reports why) and, with the tile pinned, once the paged output is
bit-identical to the dense one (else bit-identity reports why). A subject with `paged_launch`/`dense_launch` is
timed on its launches alone; without them on its whole forwards, host checks and their device waits included.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from harness import checks
from harness.compare import diagnose, view_mismatch
from harness.contract import Contract, ContractError, Dims, views
from harness.draws.cases import Case
from harness.handed.cache import filled, paging
from harness.handed.layer import in_force
from harness.results import findings, timings
from harness.results.findings import KnownPerformance
from harness.results.timings import NOT_TIMED, SLOWER, STALE, WITHIN, Timing
from harness.results.words import count, listed
from harness.run.releases import ReleaseContracts
from harness.run.session import layer_of, serves, sizes_for, supports_layer
from harness.run.targets import outside
from harness.subjects import AUTOTUNE, TileConfig, capabilities_of

HEADS = dict(num_heads=32, kv_heads=8, head_dim=128, block_size=16)
QWEN25_7B = dict(num_heads=28, kv_heads=4, head_dim=128, block_size=16)  # Qwen2.5-7B's config.json
WORKLOADS = {
    "decode 64x4k fp16": Case((1,) * 64, (4096,) * 64, **HEADS),
    "prefill 8x2k fp16": Case((2048,) * 8, (2048,) * 8, **HEADS),
    "decode 64x4k bf16": Case((1,) * 64, (4096,) * 64, **HEADS, dtype="bfloat16"),
    "prefill 8x2k bf16": Case((2048,) * 8, (2048,) * 8, **HEADS, dtype="bfloat16"),
    "decode 64x4k qwen2.5-7b": Case((1,) * 64, (4096,) * 64, **QWEN25_7B),
    "prefill 8x2k qwen2.5-7b": Case((2048,) * 8, (2048,) * 8, **QWEN25_7B),
}
SPARE_PAGES = 64  # pages past the batch's, as a serving cache has
LAYERS = 2  # a cross-layer allocation's layers; the layer timed is the last

Timer = Callable[[Callable[[], object], int, str], list[float]]  # (call, repeats, what) -> ms per repeat


@dataclass(frozen=True)
class Rates:
    """The device's ceilings, measured in the same run: bytes read + written per second by a device-to-device copy,
    FLOP/s of a fp16 matmul."""

    copy: float
    matmul: float

    def describe(self) -> str:
        return f"copy {self.copy / 1e12:.2f} TB/s (read + written), fp16 matmul {self.matmul / 1e12:.0f} TFLOP/s"


def cuda_timer(fn: Callable[[], object], repeats: int, what: str = "") -> list[float]:
    """Milliseconds of `repeats` calls, each after an L2 flush, by CUDA events (a few untimed calls first)."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def measured_rates(timer: Timer) -> Rates:
    """The copy and matmul ceilings on the current CUDA device."""
    src = torch.empty(2**30, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy_ms = statistics.median(timer(lambda: dst.copy_(src), 10, "copy"))
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    mm_ms = statistics.median(timer(lambda: a @ a, 10, "matmul"))
    return Rates(copy=2 * 2**30 * 2 / (copy_ms * 1e-3), matmul=2 * 8192**3 / (mm_ms * 1e-3))


def tile_label(tile: TileConfig | None) -> str:
    """A cell's tile: `pinned 64x32 w4 s2` (BLOCK_M x BLOCK_N, warps, stages) or `autotuned`."""
    return "autotuned" if tile is None else f"pinned {tile.block_m}x{tile.block_n} w{tile.num_warps} s{tile.num_stages}"


def roofline(case: Case, stored: tuple[torch.Tensor, torch.Tensor], ms: float, rates: Rates) -> str:
    """Decode: K/V bytes read once per second, of the copy rate; prefill: causal attention FLOP/s, of the matmul's."""
    if max(case.q_lens) == 1:
        rate = sum(t.numel() * t.element_size() for t in stored) / (ms * 1e-3)
        return f"{rate / 1e12:.2f} TB/s, {rate / rates.copy:.1%} of copy"
    pairs = sum(kv * q - q * (q - 1) / 2 for q, kv in zip(case.q_lens, case.kv_lens))
    flops = 4 * case.head_dim * case.num_heads * pairs / (ms * 1e-3)
    return f"{flops / 1e12:.0f} TFLOP/s, {flops / rates.matmul:.1%} of matmul"


def dims_of(contract: Contract, case: Case) -> Dims:
    """The cache a workload is timed in: its pages and SPARE_PAGES more; a cross-layer allocation's last layer."""
    layers = LAYERS if contract.layout.shared else 1
    return Dims(case.blocks_needed() + SPARE_PAGES, case.block_size, case.kv_heads, case.head_dim, layers, layers - 1)


@dataclass(frozen=True)
class TimedGeometry:
    """One distinct geometry and the releases (with the contract each hands) it is timed for."""

    name: str
    handed: tuple[tuple[ReleaseContracts, Contract], ...]


def geometries(subject: object, releases: Iterable[ReleaseContracts], case: Case, device: str
               ) -> tuple[list[TimedGeometry], list[str]]:
    """The distinct geometries the releases hand the subject that its forwards read at `case` (those bit-identity
    takes), and why each other one is not timed."""
    caps = capabilities_of(subject)
    handed: dict[str, list[tuple[ReleaseContracts, Contract]]] = {}
    left: dict[str, str] = {}
    for r in releases:
        for c in dict.fromkeys(r.contracts):
            if not serves(subject, c):
                continue
            why = outside(c, sizes_for(device), kernels=True) or supports_layer(
                subject, subject.name, layer_of(r, c, dims_of(c, case), case.torch_dtype), caps)
            if why:
                left.setdefault(c.name, why)
            else:
                handed.setdefault(c.name, []).append((r, c))
    by_reason: dict[str, list[str]] = {}
    for n, w in left.items():
        if n not in handed:
            by_reason.setdefault(w, []).append(n)
    return [TimedGeometry(n, tuple(h)) for n, h in handed.items()], [
        f"{count(len(ns), 'geometry')} ({listed(ns)}): {w}"
        for w, ns in by_reason.items()]


@dataclass(frozen=True)
class Failure:
    """Why a cell was not timed, as the conformance check that reports it would say it."""

    check: str
    outcome: str
    diagnosis: str


@dataclass
class Lane:
    """One subject's lane: its known performance and conformance findings, the timer, the device's rates, and
    where each line is said as it is made."""

    subject: object
    known: KnownPerformance
    conformance_known: tuple[findings.Finding, ...]
    timer: Timer
    rates: Rates
    run: str
    device: str = "cuda"
    say: Callable[[str], None] = print

    def lines(self, workload: str, case: Case, geometries: list[TimedGeometry]) -> list[Timing]:
        """Every line of one workload: per geometry and tile, a line per release that hands the geometry."""
        q, k, v = case.inputs(self.device)
        rows: list[Timing] = []
        dense: dict[tuple[str, str], tuple[torch.Tensor, float, float]] = {}
        for g in geometries:
            contract = g.handed[0][1]
            dims = dims_of(contract, case)
            stored = contract.dtype.stored(k), contract.dtype.stored(v)
            pages = paging(case.kv_lens, case.block_size, dims.num_blocks, "shuffled").to(self.device)
            kv_cache = filled(contract, dims, pages, *stored)
            want = views.split(contract, kv_cache, dims)
            splits = {r.release: self._split(r, c, kv_cache, dims, case, want) for r, c in g.handed}
            agreed = next((s for s in splits.values() if not isinstance(s, Failure)), None)
            for tile in self.tiles(case):
                key = (contract.cache_dtype, tile_label(tile))
                if key not in dense:
                    dense[key] = self._dense(workload, case, q, *stored, tile)
                failed = dense[key] if isinstance(dense[key], Failure) else None
                base = Timing(run=self.run, release="", source="", subject=self.subject.name, geometry=g.name,
                              workload=workload, tile=tile_label(tile), outcome=NOT_TIMED,
                              dense_ms=0.0 if failed else dense[key][1], band=0.0 if failed else dense[key][2],
                              threshold=self.known.threshold, device=self.device)
                timed = failed or (self._paged(base, case, q, agreed, pages, tile, dense[key][0], stored)
                                   if agreed is not None else None)
                made = [self._judged(base, splits[r.release] if isinstance(splits[r.release], Failure) else timed,
                                     r, c) for r, c in g.handed]
                rows += made
                for first, releases in alike(made):
                    self.say(f"{said(first)} [{', '.join(releases)}]")
            del kv_cache
        return rows

    def tiles(self, case: Case) -> list[TileConfig | None]:
        """The subject's pinned tile, and for an autotuning subject its own choice per call."""
        pinned = self.subject.tile_config(case)
        return [pinned, None] if AUTOTUNE in capabilities_of(self.subject) else [pinned]

    def _launcher(self, kind: str) -> Callable:
        own = getattr(self.subject, f"{kind}_launch", None)
        if own is not None:
            return own
        forward = getattr(self.subject, f"{kind}_forward")
        return lambda *args: (lambda: forward(*args))

    def _dense(self, workload: str, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               tile: TileConfig | None) -> tuple[torch.Tensor, float, float] | Failure:
        """The dense forward's output, the median of its runs' medians and the band they spread over; a Failure
        when it raises (over K/V of a cache dtype the subject's forwards cannot read)."""
        try:
            call = self._launcher("dense")(case, q, k, v, tile)
            out = call()
        except Exception as e:  # noqa: BLE001 - the subject's own error is the cell's reason
            return Failure(checks.BIT_IDENTITY.name, "subject-error", f"dense forward: {type(e).__name__}: {e}")
        medians = [statistics.median(self.timer(call, timings.REPEATS, f"dense {workload} {tile_label(tile)}"))
                   for _ in range(timings.BAND_RUNS)]
        return out, statistics.median(medians), timings.band(medians)

    def _split(self, r: ReleaseContracts, c: Contract, kv_cache: torch.Tensor, dims: Dims, case: Case,
               want: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | Failure:
        """The subject's K/V views of release r's cache, or why split-agrees would not pass them."""
        layer = layer_of(r, c, dims, case.torch_dtype)
        try:
            with in_force(layer):
                got = self.subject.split(kv_cache, layer)
        except ContractError as e:
            return Failure(checks.SPLIT_AGREES.name, "contract-error", f"split: ContractError: {e}")
        except Exception as e:  # noqa: BLE001 - the subject's own error is the cell's reason
            return Failure(checks.SPLIT_AGREES.name, "subject-error", f"split: {type(e).__name__}: {e}")
        wrong = [f"{n}: {'; '.join(m)}" for n, a, b in zip("KV", got, want) if (m := view_mismatch(a, b))]
        return Failure(checks.SPLIT_AGREES.name, "differs", f"split is not the contract's views: {' / '.join(wrong)}") \
            if wrong else got

    def _paged(self, base: Timing, case: Case, q: torch.Tensor, split: tuple[torch.Tensor, torch.Tensor], pages,
               tile: TileConfig | None, dense_out: torch.Tensor, stored: tuple[torch.Tensor, torch.Tensor]
               ) -> Timing | Failure:
        """The paged forward over the split, timed; a Failure when it raises or (pinned) is not bit-identical."""
        try:
            call = self._launcher("paged")(case, q, *split, pages, tile)
            out = call()
        except Exception as e:  # noqa: BLE001 - the subject's own error is the cell's reason
            return Failure(checks.BIT_IDENTITY.name, "subject-error", f"paged forward: {type(e).__name__}: {e}")
        if tile is not None and (out.shape != dense_out.shape or out.dtype != dense_out.dtype
                                 or diagnose(out, dense_out) is not None):
            return Failure(checks.BIT_IDENTITY.name, "differs", "paged output is not bit-identical to dense")
        ms = self.timer(call, timings.REPEATS, f"paged {base.workload} {base.geometry} {base.tile}")
        median, deciles = statistics.median(ms), statistics.quantiles(ms, n=10)
        return replace(base, outcome=WITHIN, ratio=median / base.dense_ms, paged_ms=median, repeats=len(ms),
                       paged_spread=deciles[-1] / deciles[0] - 1, roofline=roofline(case, stored, median, self.rates))

    def _judged(self, base: Timing, timed: Timing | Failure, r: ReleaseContracts, c: Contract) -> Timing:
        """Release r's line: within or slower (known where a known performance finding covers it), or not timed
        (known where a known conformance finding of the subject predicts the failure)."""
        where = dict(release=r.release, source=r.source, backends=(c.origin.backend_name,), cache_dtype=c.cache_dtype)
        if isinstance(timed, Failure):
            hit = findings.match(self.conformance_known, r.release, c.name, "none", timed.check, timed.outcome)
            return replace(base, **where, diagnosis=f"{timed.diagnosis} ({timed.check} says {timed.outcome})",
                           known=hit.id if hit else "")
        line = replace(timed, **where)
        if line.ratio > line.limit:
            hit = self.known.known(r.release, c.name, line.workload, line.tile)
            return replace(line, outcome=SLOWER, known=hit.id if hit else "")
        return line


def stale(lines: list[Timing], known: KnownPerformance) -> list[Timing]:
    """Per release, a stale line for each known performance finding that covered timed cells, none of them
    slower."""
    out = []
    for f in known.findings:
        for release in dict.fromkeys(x.release for x in lines):
            covered = [x for x in lines if x.release == release and x.outcome in (WITHIN, SLOWER)
                       and f.applies(x.release, x.geometry, x.workload, x.tile)]
            if covered and not any(x.outcome == SLOWER for x in covered):
                worst = max(covered, key=lambda x: x.ratio)
                out.append(replace(worst, geometry=f.geometry, workload=f.workload, tile=f.tile, outcome=STALE,
                                   known=f.id, diagnosis=f"none of {len(covered)} covered cells beyond its limit "
                                   f"(worst {worst.ratio:.3f}x, {worst.geometry} {worst.workload}): {f.reason}"))
    return out


def lane(subject: object, releases: list[ReleaseContracts], workloads: dict[str, Case], known: KnownPerformance,
         conformance_known: tuple[findings.Finding, ...], timer: Timer, rates: Rates, run: str,
         device: str = "cuda", say: Callable[[str], None] = print) -> list[Timing]:
    """Every line of one subject over the releases and workloads, stale known performance findings included."""
    one = Lane(subject, known, conformance_known, timer, rates, run, device, say)
    rows: list[Timing] = []
    for name, case in workloads.items():
        reason = subject.supports(case)
        if reason:
            say(f"{subject.name} {name}: not timed: {reason}")
            continue
        found, left = geometries(subject, releases, case, device)
        say(f"{subject.name} {name}: {len(found)} geometries" + (f"; not timed: {'; '.join(left)}" if left else ""))
        rows += one.lines(name, case, found)
    return rows + stale(rows, known)


def alike(lines: list[Timing]) -> list[tuple[Timing, list[str]]]:
    """Lines that differ only by release, each group once with its releases."""
    groups: dict[tuple, tuple[Timing, list[str]]] = {}
    for x in lines:
        key = (x.subject, x.workload, x.geometry, x.tile, x.outcome, x.known, x.diagnosis, x.ratio)
        groups.setdefault(key, (x, []))[1].append(x.release)
    return list(groups.values())


def said(x: Timing) -> str:
    """One line as the lane prints it."""
    word = {WITHIN: "within", SLOWER: "SLOWER", NOT_TIMED: "NOT TIMED", STALE: "stale"}[x.outcome]
    word += f" [known {x.known}]" if x.known else ""
    if x.outcome in (WITHIN, SLOWER):
        return (f"{x.subject} {x.workload} {x.geometry} {x.tile}: {word} {x.ratio:.3f}x (paged "
                f"{x.paged_ms:.3f} ms, p10-p90 {x.paged_spread:.1%}; dense {x.dense_ms:.3f} ms, band {x.band:.1%}; "
                f"limit {x.limit:.3f}); {x.roofline}")
    return f"{x.subject} {x.workload} {x.geometry} {x.tile}: {word}: {x.diagnosis}"
