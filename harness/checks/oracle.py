"""oracle: the subject's dense forward agrees with the float64 oracle (harness.compare.reference), under the sparsity
semantics the subject declares, at a stated tolerance around the envelope of its decision paths.

Tolerance |out - oracle| <= 2 * eps(dtype) * max|v|, elementwise, for fixed keep/skip decisions. Why: q, k, v are the
same rounded inputs for both, scores and softmax sums are fp32 (error ~1e-7, far below), so what remains is (1) the
unnormalised probabilities p in (0, 1] rounded to the input dtype before the PV product, a relative error <= eps/2
on each weight, so <= eps/2 * max|v| on the output (fp16 subnormals add at most kv_len * 2^-25 * max|v|, under
eps/4 * max|v| for kv_len <= 8k), and (2) the output's own rounding, <= eps/2 * |out| <= eps/2 * max|v|. That
bounds the error by eps * max|v|; the factor 2 is margin, still tight enough that one wrong key weight shows (a mask
or mapping bug moves outputs by O(|v|), i.e. hundreds of eps).
Decisions are not fixed: a sparsity decision within the fp32 error bound of its threshold may go either way, so the
output must lie within [min - tol, max + tol] over every decision path the bound allows (reference.envelope, where
the bound and why this is sound are derived). Elements outside a row's partial envelope (past the path cap) are
not judged, and the diagnosis says so. Passes and failures alike carry the share of boundary decisions.

The dense forward alone, which no release changes, runs once per session under its newest release, one target
per sparsity mode (the float64 items side by side).
"""


from __future__ import annotations

from dataclasses import dataclass

import torch

from harness import checks
from harness.checks.outcome import Outcome
from harness.compare import reference
from harness.draws import strategies
from harness.draws.cases import SPARSITY_MODES, Case
from harness.draws.strategies import Sizes
from harness.matrix import version_key
from harness.results import Word
from harness.run.implementation import Drawn, Implementation
from harness.run.session import Session
from harness.run.targets import Target
from harness.run.trial import Trial
from harness.subjects import SparsitySemantics, TileConfig, semantics_of


@dataclass(frozen=True)
class Judgement:
    """An outcome word (within-tolerance or differs) and its diagnosis."""

    word: str
    diagnosis: str


def tolerance(dtype: torch.dtype, v: torch.Tensor) -> float:
    return 2 * torch.finfo(dtype).eps * float(v.abs().max())


def judge(case: Case, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig,
          semantics: SparsitySemantics) -> Judgement:
    """`out`, a subject's dense forward, against the oracle's envelope under `semantics` with `tile`."""
    env = reference.envelope(case, q, k, v, tile, semantics)
    if out.shape != env.lo.shape:
        return Judgement(Word.DIFFERS, f"output shape {tuple(out.shape)}, oracle {tuple(env.lo.shape)}")
    o = out.to(torch.float64, copy=True)
    err = torch.maximum(env.lo - o, o.sub_(env.hi)).clamp_min_(0.0)  # in place: an 8k x 64-head output is 0.5 GiB
    nan = out.isnan()
    err[nan] = float("inf")
    tol = tolerance(case.torch_dtype, v)
    over = err > tol
    unjudged = over & env.partial[..., None] & ~nan  # a NaN is wrong on every path
    over &= ~unjudged
    notes = "; ".join(filter(None, [env.describe(), f"{int(unjudged.sum())} elements outside a partial envelope, "
                                                    "not judged (harness limit)" if unjudged.any() else ""]))
    if not over.any():
        return Judgement(Word.WITHIN_TOLERANCE, notes)
    err[~over] = 0.0
    worst = int(err.argmax())
    at = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), err.shape))
    return Judgement(Word.DIFFERS, f"dense vs float64 oracle: max abs error outside the decision envelope "
                                f"{float(err.max()):g} at (token, head, dim) {at} > tolerance {tol:g} "
                                f"(2 * eps({case.dtype}) * max|v|), {int(over.sum())} of {err.numel()} elements over"
                                + (f"; {notes}" if notes else ""))


def dense(session: Session) -> list[Target]:
    """The oracle's targets: under the session's newest release (a nox session holds one), one per sparsity mode."""
    newest = max((r for r in session.releases if r.contracts), key=lambda r: version_key(r.release), default=None)
    return [Target(newest, newest.contracts[0], "dense", m) for m in SPARSITY_MODES] if newest else []


class Oracle(Implementation):
    def targets(self, session: Session) -> list[Target]:
        return dense(session)

    def cases(self, sizes: Sizes, mode: str):
        return strategies.oracle_cases(sizes, mode)  # its float64 work bounded

    def replayed(self, session: Session, targets: list[Target], geometry: str, example: Drawn) -> list[Target]:
        """Every session release with the kept example's geometry (its own contract of it), whichever dense target
        kept it."""
        own = {r.release: next((c for c in r.contracts if c.name == example.contract.name), None)
               for r in session.releases}
        return [Target(r, own[r.release], geometry) for r in session.releases if own[r.release] is not None]

    def planned(self, session: Session, per_item: int, sample: Target | None) -> str:
        return (f"{self.check.name} {per_item} in each of {len(SPARSITY_MODES)} sparsity modes, once per session")

    def body(self, t: Trial) -> Outcome:
        case = t.example.case
        q, k, v = case.inputs(t.device)
        tile = t.call(t.subject.tile_config, case)
        out = t.call(t.subject.dense_forward, case, q, k, v, tile)
        verdict = judge(case, out, q, k, v, tile, semantics_of(t.subject))
        return Outcome(verdict.word, verdict.diagnosis)


IMPLEMENTATION = Oracle(checks.ORACLE)
