"""Compiles: what a process built from scratch versus loaded from Triton's disk cache, and the session warm-up that
builds every kernel variant a run can draw before the first example.

A Triton compile costs seconds of CPU; a load from the disk cache costs milliseconds. Counting happens in Triton's
own cache layer (`TRITON_CACHE_MANAGER` names `CountingCacheManager`): a compiled kernel is stored as one group of
files (`put_group`), a cached one is found as that group (`get_group`), so the two counts are exact whatever
decides to compile. The warm-up runs a subject's paged and dense forwards over small cases that span every
compile-time choice (`harness.draws.strategies.warmup_shards`) in one geometry per K/V element type the session's caches
hand the kernels (`forwards`: what the forward checks launch), spread over processes, one shard and geometry per
process: Triton compiles one kernel at a time per process, so processes are how compiles run in parallel. A session
runs it behind the checks that launch no kernel (`harness.run.warmup.behind`); kernel items wait for its end
(`await_warmup`), so that their examples only load kernels.
`launch_key` says what one launch compiles, read from its arguments as Triton's specialisation reads them. A warm-up
that ended without errors leaves a marker in the Triton cache named by its fingerprint; a later one with the same
fingerprint has nothing to build and is skipped (whatever is missing after all is compiled by the examples, and
counted).
"""

from __future__ import annotations

import hashlib
import inspect
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.runtime.cache import FileCacheManager

from harness.contract import Contract, Dims, views
from harness.draws.cases import Case
from harness.handed.cache import Paging, filled, paging

MANAGER = f"{__name__}:CountingCacheManager"
_counts = {"compiled": 0, "loaded": 0}


class CountingCacheManager(FileCacheManager):
    """Triton's file cache, counting kernels compiled (stored) and loaded (found) in this process."""

    def get_group(self, filename: str):
        group = super().get_group(filename)
        if group is not None and filename.endswith(".json"):
            _counts["loaded"] += 1
        return group

    def put_group(self, filename: str, group):
        if filename.endswith(".json"):
            _counts["compiled"] += 1
        return super().put_group(filename, group)


@dataclass(frozen=True)
class Counts:
    """Kernels compiled from scratch and loaded from the disk cache by one process (or summed over several)."""

    compiled: int = 0
    loaded: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.compiled + other.compiled, self.loaded + other.loaded)

    def __sub__(self, other: Counts) -> Counts:
        return Counts(self.compiled - other.compiled, self.loaded - other.loaded)


def counts() -> Counts:
    """This process's counts so far."""
    return Counts(**_counts)


@dataclass(frozen=True)
class Warmup:
    """What a session warm-up did: cases run, kernels compiled and loaded, processes, wall time, errors seen."""

    cases: int
    counts: Counts
    processes: int
    seconds: float
    errors: tuple[str, ...] = ()
    skipped: bool = False

    def describe(self) -> str:
        if self.skipped:
            return f"warm-up: skipped, the Triton cache holds a finished warm-up of these {self.cases} cases"
        text = (f"warm-up: {self.cases} cases in {self.processes} processes, {self.seconds:.1f} s: "
                f"{self.counts.compiled} compiled, {self.counts.loaded} loaded from the disk cache")
        if self.errors:
            text += f"; {len(self.errors)} cases raised (the examples will report them), first: {self.errors[0]}"
        return text


def fingerprint(subject: object, case_shards: list[list[Case]], contracts: list[Contract], devices: list[str]) -> str:
    """What a warm-up builds depends on: the subject's module source and version (if it has one), the cases, the
    geometries' cache dtypes, the kinds of device (not how many), Triton and torch. A kernel changed outside the
    subject's module without a version change is not seen: its variants are then compiled by the examples, and
    counted."""
    module = inspect.getmodule(type(subject))
    parts = [type(subject).__qualname__, inspect.getsource(module) if module else "", str(getattr(subject, "version", "")),
             repr(case_shards), *(c.cache_dtype for c in contracts), triton.__version__, torch.__version__,
             *sorted({torch.cuda.get_device_name(d) if d.startswith("cuda") else d for d in devices})]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _marker(key: str) -> Path:
    return Path(triton.knobs.cache.dir) / "kvconform-warmup" / key


def _ended(run: str) -> Path:
    return Path(triton.knobs.cache.dir) / "kvconform-warmup" / f"ended-{run}"


def warm_ended(run: str, what: str) -> None:
    """Say that run `run`'s warm-up has ended (`what` it did), for the processes waiting on it."""
    _ended(run).parent.mkdir(parents=True, exist_ok=True)
    _ended(run).write_text(what + "\n")


def await_warmup(run: str, limit: float) -> str:
    """Wait until run `run`'s warm-up has ended, at most `limit` seconds (0: no limit); what it did. TimeoutError
    past the limit."""
    start = time.perf_counter()
    while not _ended(run).exists():
        if limit and time.perf_counter() - start > limit:
            raise TimeoutError(f"the session warm-up of run {run} did not end within {limit:g} s")
        time.sleep(0.2)
    return _ended(run).read_text().strip()


def warm(subject: str, case_shards: list[list[Case]], contracts: list[Contract], devices: list[str],
         processes: int, key: str = "") -> Warmup:
    """Run the forwards of the subject named `subject` (harness.subjects.load_subject) over every case, in shards
    that share compiled variants, in each of `contracts`' geometries: `processes` at a time, job i on
    devices[i % len]. With a `key` (fingerprint), skipped where a warm-up of that key finished before in this
    Triton cache."""
    start = time.perf_counter()
    pairs = [(shard, c) for c in contracts for shard in case_shards if shard]
    jobs = [(subject, shard, c, devices[i % len(devices)]) for i, (shard, c) in enumerate(pairs)]
    if key and _marker(key).exists():
        return Warmup(sum(len(j[1]) for j in jobs), Counts(), 0, 0.0, skipped=True)
    processes = max(1, min(processes, len(jobs)))
    context = multiprocessing.get_context("spawn")  # a forked CUDA or Triton state is not usable in the child
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        done = list(pool.map(_warm_shard, jobs))
    total, errors = Counts(), []
    for c, e in done:
        total += c
        errors += e
    if key and not errors:
        _marker(key).parent.mkdir(parents=True, exist_ok=True)
        _marker(key).touch()
    return Warmup(sum(len(j[1]) for j in jobs), total, processes, time.perf_counter() - start, tuple(errors))


def forwards(subject: object, case: Case, contract: Contract, dims: Dims, pages: Paging, q: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """The launches of one example of the forward checks: the dense forward over token rows k, v as `contract`
    stores them, and the paged forward over the contract's K/V views of a kv_cache holding them (the subject's split
    reaches a kernel only where it agrees with them, Runner.split; the oracle's dense forward over model-dtype rows
    is the model-dtype contract's)."""
    k, v = contract.dtype.stored(k), contract.dtype.stored(v)
    tile = subject.tile_config(case)
    subject.dense_forward(case, q, k, v, tile)
    keys, values = views.split(contract, filled(contract, dims, pages, k, v), dims)
    subject.paged_forward(case, q, keys, values, pages, tile)


def launch_key(kernel: object, args: tuple, kwargs: dict) -> tuple:
    """What Triton compiles one launch `kernel[grid](*args, **kwargs)` for: each constexpr's value; each tensor's
    element type and whether its address is 16-byte aligned; each other argument's type, and for an integer Triton
    specialises on, whether it is 1 or a multiple of 16; the launch options. Read from the arguments, as Triton's
    specialisation reads them, so that what a subject says of its variants is not taken on trust. A meta tensor's
    alignment is its offset's (the allocators' bases are aligned far beyond 16 bytes)."""
    names, constexpr, fixed = _params(kernel)
    bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
    key = []
    for name in names:
        value = bound.get(name)
        if name in constexpr:
            key.append((name, value))
        elif isinstance(value, torch.Tensor):
            addr = (value.storage_offset() * value.element_size() if value.is_meta else value.data_ptr())
            key.append((name, str(value.dtype), name in fixed or addr % 16 == 0))
        elif isinstance(value, bool):
            key.append((name, "i1"))
        elif isinstance(value, int):
            width = "i32" if -2**31 <= value < 2**31 else "u64" if value >= 2**63 else "i64"
            key.append((name, width) if name in fixed else (name, width, value == 1, value % 16 == 0))
        else:
            key.append((name, type(value).__name__))
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
    return (getattr(kernel, "__name__", None) or kernel.fn.__name__, tuple(key), options)


def _params(kernel: object) -> tuple[list[str], set[str], set[str]]:
    # A compiled kernel (JITFunction) lists its parameters; the interpreter's function keeps the Python one.
    if hasattr(kernel, "params"):
        return ([p.name for p in kernel.params], {p.name for p in kernel.params if p.is_constexpr},
                {p.name for p in kernel.params if p.do_not_specialize})
    sig = inspect.signature(kernel.fn)
    return (list(sig.parameters), {n for n, p in sig.parameters.items() if "constexpr" in str(p.annotation)},
            set(kernel.kwargs.get("do_not_specialize") or ()))


def warm_paging(case: Case) -> tuple[Dims, Paging]:
    """The cache size and page table a warm-up case runs in: exactly the pages it needs, in order."""
    dims = Dims(case.blocks_needed(), case.block_size, case.kv_heads, case.head_dim)
    return dims, paging(case.kv_lens, case.block_size, dims.num_blocks, "sequential")


def _warm_shard(job: tuple[str, list[Case], Contract, str]) -> tuple[Counts, list[str]]:
    from harness.subjects import load_subject

    subject_name, shard, contract, device = job
    before = counts()  # a pool process runs several jobs: this job's counts are what it adds
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    subject = load_subject(subject_name)
    errors = []
    for case in shard:
        if subject.supports(case):
            continue
        try:
            dims, pages = warm_paging(case)
            forwards(subject, case, contract, dims, pages.to(device), *case.inputs(device))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a warm-up never decides an outcome; the examples do
            errors.append(f"{case!r}: {type(e).__name__}: {e}"[:300])
    return counts() - before, errors
