"""One example of one target as a check receives it (`Trial`), and how a call into the subject settles an example
(`Verdict`, `NotRun`, `Poisoned`; what a check returns is harness.checks.outcome's `Outcome`).

A check is a function `check(trial) -> Outcome`. The trial holds the example, the layer its release hands with the
example's cache, and the calls a check makes into the subject: anything the subject returns or raises there is the
subject's outcome (`Verdict`), never kvconform's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property

import torch

from harness.checks.outcome import Outcome
from harness.compare import bits
from harness.contract import ContractError, views
from harness.device import costs, devices
from harness.handed.cache import Paging, filled, read
from harness.handed.layer import Layer, in_force
from harness.results import Word
from harness.run.implementation import Drawn
from harness.run.sink import POISONED
from harness.run.targets import Target


class Verdict(Exception):
    """Raised out of a check by a subject call that failed: it is the subject's outcome, not a harness bug."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.diagnosis)
        self.outcome = outcome


class NotRun(Exception):
    """Raised out of a check whose example cannot say anything of the subject (the reason): a kernel check's where the
    subject's split already gets it wrong, a connector's in a replay where the subject needs vLLM's own classes."""


class SubjectRefused(Exception):
    """Raised out of a check whose example the subject refuses, in its words (the reason): `unsupported`, as when its
    `supports` or `supports_layer` says so."""


class Poisoned(BaseException):
    """A subject's call left this process's device unusable. A BaseException so that hypothesis does not shrink
    (every further call would fail too)."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.diagnosis)
        self.outcome = outcome


@dataclass(frozen=True)
class Prepared:
    """An example made concrete: token tensors (k and v as the cache stores them, the dense forward's input), the
    release's kv_cache holding them, and its page table."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_cache: torch.Tensor
    paging: Paging


@dataclass(frozen=True)
class Trial:
    """One example (`example`, with the check's `extra` draw) of `target`, for check `check`, on `device`. What
    makes a cache of the example (`layer`, `prepare`, `allocate`, the splits) takes a placed example
    (harness.draws.strategies.Example) of a target with a contract."""

    target: Target
    check: str
    example: Drawn
    extra: object
    subject: object
    device: str

    @cached_property
    def layer(self) -> Layer:
        """The layer value of the example's cache: what its release hands a layer."""
        ex = self.example
        return self.target.handed_layer(ex.dims, ex.case.torch_dtype)

    def prepare(self) -> Prepared:
        """Tokens written where the release's contract says (what vLLM's cache write does), pages poisoned."""
        ex = self.example
        with costs.phase("cache"):
            q, k, v = ex.inputs(self.device)
            k, v = ex.contract.dtype.stored(k), ex.contract.dtype.stored(v)
            pages = ex.paging().to(self.device)
            return Prepared(q, k, v, filled(ex.contract, ex.dims, pages, k, v, ex.within), pages)

    def allocate(self) -> torch.Tensor:
        """The example's kv_cache, every element poisoned, nothing written."""
        ex = self.example
        with costs.phase("cache"):
            return views.allocate(ex.contract, ex.dims, ex.case.torch_dtype, self.device, ex.within)

    def call(self, fn, *args, layer: Layer | None = None):
        """Call into the subject; its ContractError is a contract-error, anything else it raises a subject-error.
        A call runs with `layer`'s release in force (harness.handed.layer.in_force), by default that of the layer it
        is handed (or the first of layers by name), if any.
        On CUDA the call is waited for, so that a fault of the subject's kernel is reported against this call."""
        layer = layer or next((a for a in args if isinstance(a, Layer)), None) or next(
            (x for a in args if isinstance(a, dict) for x in a.values() if isinstance(x, Layer)), None)
        try:
            with costs.phase("setting"), in_force(layer) if layer is not None else contextlib.nullcontext():
                with costs.phase("subject"):
                    out = fn(*args)
            if self.device.startswith("cuda"):
                with costs.phase("sync"):
                    torch.cuda.synchronize(self.device)
            return out
        except ContractError as e:
            raise Verdict(Outcome(Word.CONTRACT_ERROR, f"{type(e).__name__}: {e}")) from e
        except Exception as e:
            why = devices.poisoned(self.device)
            if why:
                raise Poisoned(Outcome(Word.SUBJECT_ERROR, f"{type(e).__name__}: {e}; {POISONED} ({why})")) from e
            raise Verdict(Outcome(Word.SUBJECT_ERROR, f"{type(e).__name__}: {e}")) from e

    def subject_split(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The subject's split of `kv_cache` handed with the trial's layer: its (K, V) pair of tensors; anything
        else it returns is its subject-error, naming what it returned."""
        got = self.call(self.subject.split, kv_cache, self.layer)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            what = (f"a {type(got).__name__} of {len(got)} ({', '.join(type(t).__name__ for t in got)})"
                    if isinstance(got, (tuple, list)) else f"a {type(got).__name__}")
            raise Verdict(Outcome(Word.SUBJECT_ERROR, f"split of kv_cache {tuple(kv_cache.shape)} returned {what}, "
                                                      "not a (K, V) pair of tensors"))
        return got

    def split(self, p: Prepared) -> tuple[torch.Tensor, torch.Tensor]:
        """The subject's K and V views of the prepared cache, for a kernel check. NotRun when they do not read the
        tokens written where the contract says: kernels over them could only restate split-agrees' finding."""
        got = self.subject_split(p.kv_cache)
        want = views.split(self.example.contract, p.kv_cache, self.example.dims, self.example.within)
        for name, a, b in zip("KV", got, want):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise NotRun(f"the subject's {name} view is {tuple(a.shape)} {a.dtype}, the contract's "
                             f"{tuple(b.shape)} {b.dtype}")
        # Both sides compared on the device and read back together: one wait for the host, not one per side.
        equal = torch.stack([(bits(a) == bits(b)).all() for a, b in zip(read(*got, p.paging), (p.k, p.v))]).tolist()
        for name, same in zip("KV", equal):
            if not same:
                raise NotRun(f"the subject's {name} view does not read the tokens written through the contract's "
                             f"{name} view (split-agrees reports the split)")
        return got
