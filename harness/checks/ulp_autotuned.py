"""ulp-autotuned: paged forward over the subject's own split of the release's kv_cache against its dense forward, each
call tuned by the subject's own autotuner (`tile` None): bit-identical, or within the rounding bound derived here;
beyond it, differs.

Where one pinned tile makes the two bit-identical (bit-identity), the autotuner may run them under different tile
configs: the same arithmetic in another order. The bound is on |paged - dense| elementwise, derived from the
arithmetic of a kernel that does what modelopt's `_attn_fwd` does, never fitted to measured differences: one
online-softmax pass per query row over its n keys in tiles of BLOCK_N, with the scores, running max, row sum and
accumulator in fp32, P rounded to the input dtype for the P.V product and the output rounded once to that dtype.
u is the dtype's unit roundoff (fp16 2^-11, bf16 2^-8), u32 = 2^-24, gamma(m) = m*u32 / (1 - m*u32). Each call is
bounded against the exact softmax-weighted mean o = sum w_i v_i / sum w_i of the same stored q, k, v (and the
subject's own fp32 scale), and the two calls' bounds add:

    tolerance = 2 * B * max|v|,   B = E / (1 - E)   (every error below is a factor (1 + e), and prod(1 + e) - 1
                                                     <= sum(e) / (1 - sum(e)): B holds their products too)
    E = 3u + gamma(2n) + gamma(n) + n*tiny*u + 10*(n/BLOCK_N_min + 1)*u32 + 2*ln(n)*u32 + 2*u32
        + 2*(gamma(2D) + 2*u32)*R

Lemma: weights perturbed relatively by e_i move a weighted mean by |sum w_i e_i (v_i - o)| / sum w_i (1 + e_i),
at most 2 * sum(w_i |e_i|) * max|v| to first order (|v_i - o| <= 2 max|v|).
- 3u, the dtype's roundings: the output's (u*|o| <= u*max|v|), and P's: p_i rounded by a relative u, in the
  numerator alone where the row sum adds the unrounded p (modelopt: <= u*max|v|), in both sums a weight
  perturbation (<= 2u*max|v|, the lemma). n*tiny*u (tiny the dtype's smallest normal): a p below it is subnormal,
  rounded by at most tiny*u absolute (fp16 2^-25, bf16 2^-134), against a row sum >= 1 (the key at the row's max
  contributes p = 1).
- gamma(2n) + gamma(n), the sums of n terms in any order or tree: the numerator on tensor cores, whose products of
  fp16/bf16 operands are exact in fp32 and whose additions truncate (one ulp, 2*u32 an addition: Fasi, Higham,
  Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", 2021), <= gamma(2n) * sum|p v|; the row sum
  rounded to nearest, <= gamma(n) * sum p. (Rounded to nearest throughout, as in Triton's interpreter: 2*gamma(n).)
- 10*(n/BLOCK_N_min + 1)*u32, the online-softmax rescaling: at most n/BLOCK_N + 1 tiles, BLOCK_N_min the smallest
  BLOCK_N among the subject's `autotune_configs` (modelopt 0.46-0.47: 32 in each of its _FWD_CONFIGS, BLOCK_M 16,
  64, 128; 0.45: 32, 64 or 128). A tile rescales acc and row_sum by c = exp2(row_max - m_new), each product
  rounded once (2*u32 on the ratio); c and every p = exp2(s - m_new) carry exp2's own error, at most 2 ulp =
  2^-22 = 4*u32 relative (NVIDIA's ex2.approx.f32, which Triton's exp2 lowers to; numpy's, in the interpreter,
  is within one), which scales the weights of the keys it touches alike in the numerator and the row sum:
  2*4*u32 by the lemma (p's once a key, charged as one more tile).
- 2*ln(n)*u32, the exponents' arguments: s - m_new and row_max - m_new each round by a relative u32; along the
  rescalings after key i they telescope to X_i = M - s_i (M the row's final max), so key i's weight moves by at
  most ln(2)*u32*X_i, and sum w_i X_i <= log2(n) (the weights' entropy in bits, less log2 of a row sum >= 1).
- 2*u32: the division acc / row_sum, and exp2's underflow (at most 2^-126 a key).
- 2*(gamma(2D) + 2*u32)*R, the scores: a dot of D exact products on tensor cores (truncating: gamma(2D)) and one or
  two fp32 scalings (the softmax scale, log2(e)) err by at most (gamma(2D) + 2*u32) * scale * sum_d |q_d k_d| in
  natural units, a relative weight error of as much (a shift common to a row cancels); R = scale * max|q| *
  max|k| (row norms over the head dim D) bounds scale * sum_d |q_d k_d| (Cauchy-Schwarz).
At fp16, n = 8192, D = 128, BLOCK_N_min = 32, R = 16 (unit-normal inputs): E = 1.46e-3 (3u) + 1.47e-3 (sums) +
2.4e-4 (subnormal P) + 1.5e-4 (tiles) + 4.9e-4 (scores), a tolerance of 7.7e-3 * max|v|; at bf16 2.8e-2 * max|v|.
A mask or page-table bug moves an output by a key's weight times O(|v|): at the few hundred keys of the CPU's
examples, far outside.

Only sparsity mode "none" is drawn (the declaration's `mode`; a third of an item's examples, as an oracle item of
one mode): skip-softmax and N:M decisions follow the tile (modelopt keeps or skips a key tile for BLOCK_M queries
together) and a decision near its threshold goes either way under any rounding, so autotuned calls may rightly part
beyond rounding there; bit-identity checks those modes against a pinned tile, the oracle against their semantics.
"""


from __future__ import annotations

import math

import torch

from harness import checks
from harness.checks.bit_identity import Placed
from harness.checks.outcome import Outcome
from harness.compare import diagnose
from harness.draws.cases import Case
from harness.results import Word
from harness.run.trial import Trial
from harness.subjects import TileConfig

U32 = 2.0**-24


def gamma(m: int) -> float:
    """m*u32 / (1 - m*u32): the relative error bound of m fp32 roundings."""
    if m * U32 >= 1:
        raise ValueError(f"no fp32 rounding bound for {m} operations")
    return m * U32 / (1 - m * U32)


def bound(dtype: torch.dtype, keys: int, head_dim: int, block_n: int, reach: float) -> float:
    """B: one autotuned call's error against the exact softmax-weighted mean, in units of max|v|, for rows of at most
    `keys` keys in tiles of at least `block_n`, scores reaching `reach` (the module docstring derives each term)."""
    u, tiny = torch.finfo(dtype).eps / 2, torch.finfo(dtype).tiny
    e = (3 * u + gamma(2 * keys) + gamma(keys) + keys * tiny * u + 10 * (keys / block_n + 1) * U32
         + 2 * math.log(keys) * U32 + 2 * U32 + 2 * (gamma(2 * head_dim) + 2 * U32) * reach)
    return e / (1 - e)


def tolerance(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_n: int) -> float:
    """The largest |paged - dense| two autotuned calls of `case` over q, k, v may show: 2 * B * max|v|."""
    reach = case.scale * float(q.float().norm(dim=-1).max()) * float(k.float().norm(dim=-1).max())
    return 2 * bound(case.torch_dtype, max(case.kv_lens), case.head_dim, block_n, reach) * float(v.abs().max())


def judge(case: Case, paged: torch.Tensor, dense: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          configs: tuple[TileConfig, ...]) -> tuple[Word, str]:
    """The outcome word and diagnosis of two autotuned outputs of `case`, the subject tuning among `configs`."""
    if paged.shape != dense.shape or paged.dtype != dense.dtype:
        return Word.DIFFERS, (f"paged {tuple(paged.shape)} {paged.dtype} vs dense {tuple(dense.shape)} "
                              f"{dense.dtype}")
    if not configs or not all(isinstance(c, TileConfig) for c in configs):
        return Word.SUBJECT_ERROR, f"autotune_configs returned {configs!r}, not one or more TileConfigs"
    d = diagnose(paged, dense)
    if d is None:
        return Word.BIT_IDENTICAL, ""
    block_n = min(c.block_n for c in configs)
    tol = tolerance(case, q, k, v, block_n)
    a, b = paged.double(), dense.double()
    err = torch.where(a.isnan() & b.isnan(), 0.0, (a - b).abs().nan_to_num(nan=math.inf))
    over = err > tol
    figures = (f"paged vs dense, each autotuned: {d}; tolerance {tol:g} (2 * B * max|v|, n {max(case.kv_lens)}, "
               f"BLOCK_N >= {block_n})")
    if not over.any():
        return Word.WITHIN_TOLERANCE, figures
    at = tuple(int(i) for i in torch.unravel_index(err.argmax().cpu(), err.shape))
    return Word.DIFFERS, f"{int(over.sum())} of {err.numel()} elements beyond, the most at {at}; {figures}"


class UlpAutotuned(Placed):
    def body(self, t: Trial) -> Outcome:
        case, p = t.example.case, t.prepare()
        keys, values = t.split(p)
        configs = t.call(t.subject.autotune_configs, case)
        paged = t.call(t.subject.paged_forward, case, p.q, keys, values, p.paging, None)
        dense = t.call(t.subject.dense_forward, case, p.q, p.k, p.v, None)
        return Outcome(*judge(case, paged, dense, p.q, p.k, p.v, configs))


IMPLEMENTATION = UlpAutotuned(checks.ULP_AUTOTUNED)
