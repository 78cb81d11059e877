"""The subject's dense forward agrees with the float64 oracle (harness.reference), under the sparsity semantics the
subject declares, at a stated tolerance around the envelope of its decision paths.

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
"""

from dataclasses import dataclass

import torch

from harness import checks, reference
from harness.cases import Case
from harness.checks.outcome import Outcome
from harness.results import Word
from harness.subjects import SparsitySemantics, TileConfig, semantics_of

CHECK = checks.ORACLE  # its declaration: what it needs, costs and draws


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


def check(t):
    case = t.example.case
    q, k, v = case.inputs(t.device)
    tile = t.call(t.subject.tile_config, case)
    out = t.call(t.subject.dense_forward, case, q, k, v, tile)
    verdict = judge(case, out, q, k, v, tile, semantics_of(t.subject))
    return Outcome(verdict.word, verdict.diagnosis)


def test_oracle(conformance, dense_target):
    conformance.run(dense_target, CHECK, check)


def test_oracle_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
