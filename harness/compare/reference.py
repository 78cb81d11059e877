"""A float64 PyTorch oracle for sparse attention under a subject's declared sparsity semantics, and the envelope of
outputs that the subject's fp32 keep/skip decisions allow.

Conventions. Per sequence, the q_len queries are the last positions of the kv_len key span (query t sits at
q_pos = kv_len - q_len + t); query head h reads kv head h // (num_heads // kv_heads). Causally masked and
out-of-range keys never count, in any sparsity mode. Scores are in log2 units, s = q.k * scale * log2(e), as the
kernels compute them (a row's weights 2^(s - max) are its softmax). `semantics` (harness.subjects.SparsitySemantics)
picks the rules subjects legitimately differ on; the default is the built-in subject's. `tile` is the subject's
TileConfig (or its block_n alone, enough unless skip decisions are per query tile).
- nm: keys form aligned groups of m (group g = keys [g*m, (g+1)*m)); a row keeps the n highest-scoring valid keys
  of each group (ties to the lower key index; for m in nm_tied_kept, every key tied with the n-th as well), plus
  every valid key of the dense windows: key < sink, and key > q_pos - recent ("to_kv_end") or
  q_pos - recent < key <= q_pos ("to_query"); with nm_dense_decode_rows, all keys of a q_len == 1 sequence.
- skip_softmax: key tiles of block_n keys aligned at key 0, visited in order. A decision unit, a row ("row") or the
  valid rows of one head's queries [i*block_m, (i+1)*block_m) of a sequence ("query_tile"), drops a tile when each
  of its rows may: a row may when margin = (tile_max - running_max) - log2(threshold) < 0, or when the tile holds
  none of its keys. running_max is the max over the tiles the unit kept before (the first tile with a valid key is
  always kept); a dropped tile adds nothing, not even to the running max; a kept tile counts for all the unit's rows.
  Lemma: a row may drop a tile only when tile_max < running_max + log2(threshold) < running_max, so keeping it would
  not move the max either: running_max before tile t is the prefix max of the tile maxima before t, whatever was
  dropped. The kernels' own fp32 running max obeys it too (they drop only when the computed tile_max - m < log2 of
  the threshold < 0).

The envelope. The kernels decide in fp32 from fp16/bf16/fp32 inputs, the oracle in float64; a key or tile kept or
dropped moves the output by O(|v|), far past a rounding tolerance, so near a threshold the oracle cannot say which
way the kernel went. It bounds how far the kernel's decision inputs can be off and judges against every decision
path the bound allows.
- Score error. The kernels compute ŝ = fl(fl(q.k) * ĉ), ĉ = fl32(scale * log2 e). For fp32 summation of D terms in
  any order with rounding to nearest, |fl(q.k) - q.k| <= γ_D Σ|q_i k_i|, γ_D = D u / (1 - D u), u = 2^-24 (Higham,
  Accuracy and Stability of Numerical Algorithms, eq. 3.5; D is the head dim padded to a power of two, the padding
  terms exact zeros). Tensor cores do not round to nearest: each step adds k >= 2 exact products to the accumulator,
  all k + 1 aligned to the largest exponent and truncated, then truncates the sum (Fasi, Higham, Mikaitis, Pranesh
  2021). Each of those k + 2 truncations loses < 2u of the step's largest magnitude, itself <= Σ|q_i k_i| (first
  order), so a step loses < (k + 2) 2u Σ|q_i k_i| and the D / k steps 2 (1 + 2/k) D u Σ|q_i k_i| <= 4 D u Σ|q_i k_i|:
  the factor F = 4 on γ_D, whatever the order of the steps. Rounding ĉ and the product add < 3u (2u at first order;
  the slack covers float64's own rounding, < D 2^-53). So |ŝ_j - s_j| <= e_j = (F γ_D + 3u) a_j with
  a_j = Σ_i |q_i k_ji| scale log2 e.
- Decision bound. A max of computed scores is within the largest e of its set of the exact max: the tile max M
  within E_t (the tile's largest e), the running max m within E_m (the largest e of earlier tiles). With λ the
  threshold, the built-in compares fl(M̂ - m̂) < fl32(log2 λ), modelopt M̂ < fl(m̂ + fl32(log2 λ)); either
  comparison has the sign of the exact margin when |margin| > B = (1 + u)(E_t + E_m) + 2u(|M| + |m|) + 3u|log2 λ|.
  A row decision with |margin| <= B is a boundary decision; a unit decision is one when no row surely keeps and
  not all surely drop.
- N:M near-ties. ŝ_i lies in [s_i - e_i, s_i + e_i]. A key is surely in the top n when fewer than n valid keys of
  its group can reach its lowest, surely out when n keys surely beat its highest; the kernel kept the sure keys and
  n - |sure| (at least that many for tied-kept m) of the uncertain rest. A group with an uncertain key outside the
  dense windows is a near-tie. The plain tolerance does not cover it: swapping two near-tied keys a, b moves weight
  w from v_a to v_b, |Δout| ~ w |v_a - v_b| / Σw, O(|v|) in a short row or for a dominant key.
- Paths. Per unit (a row; a query tile for per-query-tile skip decisions) a path takes one choice at each boundary
  decision or near-tie group, the exact one or an alternative, and the exact choice everywhere else. By the lemma
  every path has the same running max (a tile dropped on any path has M < m, which needs B < |log2 λ|; a unit
  where that fails is left to its exact path and marked partial), so later margins are the same on every path and
  the paths are the product of the choices; each path's output is the exact path's weighted sums with one tile's
  (one group's changed keys') weights added or removed per choice. A unit with more than `cap` paths keeps only the
  paths that leave the exact path at one decision, and its rows are marked partial.
- Soundness. A non-boundary decision cannot flip (the computed comparison has the exact margin's sign), so the
  kernel's decision sequence is one of the paths (the set may hold more, which only widens the envelope near a
  boundary). On its own path the kernel's output is within the rounding tolerance of that path's float64 output
  (harness.checks.oracle's tolerance argument holds for fixed decisions), so it lies within
  [min over paths - tol, max over paths + tol] elementwise. A partial row's paths are a subset of the set: inside
  their envelope is inside the full one; outside it cannot be judged.
Memory: one (sequence, kv head) at a time, in blocks of whole units of about CHUNK_BYTES of working set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.draws.cases import Case
from harness.subjects import SparsitySemantics, TileConfig

LOG2E = 1.4426950408889634
U = 2.0**-24  # fp32 unit roundoff
TENSOR_CORE_FACTOR = 4
PATH_CAP = 1024
CHUNK_BYTES = 2**29
NEG = float("-inf")


@dataclass(frozen=True)
class Envelope:
    """Elementwise bounds [lo, hi] on a subject's output over every decision path its fp32 arithmetic allows, and
    the counts behind them. Without boundary decisions lo == hi == the oracle's output."""

    lo: torch.Tensor  # [total_q, num_heads, head_dim] float64
    hi: torch.Tensor
    partial: torch.Tensor  # bool [total_q, num_heads]: rows past the path cap; their [lo, hi] is a subset's
    kind: str  # what was decided: "skip decisions", "N:M rank decisions", or "" (no sparsity)
    decisions: int  # unit-tile keep/skip decisions, or row-group rank decisions (groups of more than n valid keys)
    boundary: int  # of them, within the error bound of going the other way
    paths: int  # paths beyond the exact one
    rows: int  # rows those paths run through

    def describe(self) -> str:
        """One line for an outcome's diagnosis, e.g. 'skip decisions within the error bound: 37 of 1,048,576
        (3.5e-05); envelope of 40 more paths over 12 rows'."""
        if not self.kind:
            return ""
        share = self.boundary / self.decisions if self.decisions else 0.0
        text = f"{self.kind} within the error bound: {self.boundary:,} of {self.decisions:,} ({share:.1e})"
        if self.paths:
            text += f"; envelope of {self.paths:,} more paths over {self.rows:,} rows"
        if self.partial.any():
            text += (f"; {int(self.partial.sum()):,} rows past the path cap or with decisions that may interact: "
                     "their envelope is partial")
        return text


def attention(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | int,
              semantics: SparsitySemantics = SparsitySemantics()) -> torch.Tensor:
    """Output [total_q, num_heads, head_dim] in float64 from token rows q, k [total_kv, kv_heads, D], v, every
    decision taken exactly."""
    return _evaluate(case, q, k, v, tile, semantics, bound=False, cap=PATH_CAP).lo


def envelope(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | int,
             semantics: SparsitySemantics = SparsitySemantics(), cap: int = PATH_CAP) -> Envelope:
    """The oracle's output widened over every decision path the error bound allows (module docstring)."""
    return _evaluate(case, q, k, v, tile, semantics, bound=True, cap=cap)


def score_error(head_dim: int) -> float:
    """e_j / a_j: the bound on a kernel's fp32 score error relative to Σ|q_i k_i| scale log2 e."""
    d = 1 << (head_dim - 1).bit_length()
    return TENSOR_CORE_FACTOR * d * U / (1 - d * U) + 3 * U


def decision_bound(tile_max: torch.Tensor, running: torch.Tensor, tile_err: torch.Tensor, running_err: torch.Tensor,
                   log2_threshold: float) -> torch.Tensor:
    """B: a skip decision whose exact margin is farther than this from 0 is the one the kernel took."""
    return ((1 + U) * (tile_err + running_err) + 2 * U * (tile_max.abs() + running.abs())
            + 3 * U * abs(log2_threshold))


def nm_keep(s: torch.Tensor, valid: torch.Tensor, n: int, m: int, tied_kept: bool = False) -> torch.Tensor:
    """The valid keys among the top n of each aligned group of m keys along the last axis (ties to the lower key
    index, or with `tied_kept` every key tied with the n-th)."""
    kv_len = s.shape[-1]
    s, ok = _groups(s.masked_fill(~valid, NEG), m, NEG), _groups(valid, m, False)
    if tied_kept:
        nth = s.topk(n, -1).values[..., -1:]
        return (ok & (s >= nth)).flatten(-2)[..., :kv_len]
    idx = torch.arange(m, device=s.device)
    s_j, s_i = s[..., :, None], s[..., None, :]
    # beats[..., j, i]: key i outranks key j (higher score, or equal score and lower index).
    beats = ok[..., None, :] & ((s_i > s_j) | ((s_i == s_j) & (idx[None, :] < idx[:, None])))
    return (ok & (beats.sum(-1) < n)).flatten(-2)[..., :kv_len]


def skip_tiles(s: torch.Tensor, valid: torch.Tensor, block_n: int, threshold: float) -> torch.Tensor:
    """`valid` [..., rows of a unit, keys] without the key tiles each unit drops (module docstring)."""
    return valid & ~_per_key(_drops(_tile_max(s.masked_fill(~valid, NEG), block_n, NEG), math.log2(threshold))[0],
                             block_n, s.shape[-1])


# ---- evaluation, one block of whole units at a time -------------------------------------------------------------


@dataclass(frozen=True)
class _Choices:
    """A block's decisions within the error bound, sorted by unit, each with its alternatives to the exact choice
    (sorted by decision): per alternative, the change it makes to the weighted sums of each of the unit's rows."""

    unit: torch.Tensor  # [n] long
    alternatives: torch.Tensor  # [n] long
    d_num: torch.Tensor  # [a, rows of a unit, D]: change of Σ w v
    d_den: torch.Tensor  # [a, rows of a unit]: change of Σ w
    partial: torch.Tensor  # bool [units]: decisions left to their exact choice (the lemma's premise fails, or too
    # many uncertain keys in one group)
    decisions: int
    boundary: int


@dataclass(frozen=True)
class _Block:
    """One block's bounds [units, rows of a unit, D], partial units, and counts."""

    lo: torch.Tensor
    hi: torch.Tensor
    partial: torch.Tensor
    decisions: int = 0
    boundary: int = 0
    paths: int = 0
    rows: int = 0


def _evaluate(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | int,
              semantics: SparsitySemantics, bound: bool, cap: int) -> Envelope:
    sp = case.sparsity
    width = 1
    if sp.mode == "skip_softmax" and semantics.skip_decision == "query_tile":
        if not isinstance(tile, TileConfig):
            raise ValueError("per-query-tile skip decisions need the subject's TileConfig (its block_m), not block_n")
        width = tile.block_m
    block_n = tile.block_n if isinstance(tile, TileConfig) else tile
    group = case.num_heads // case.kv_heads
    lo = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    hi = torch.empty_like(lo)
    partial = torch.zeros(q.shape[:2], dtype=torch.bool, device=q.device)
    totals = [0, 0, 0, 0]
    q0 = kv0 = 0
    for q_len, kv_len in zip(case.q_lens, case.kv_lens):
        padded = -(-q_len // width) * width
        tok = torch.arange(padded, device=q.device)
        per_block = max(1, CHUNK_BYTES // (_bytes_per_score(sp) * kv_len * width))
        for g in range(case.kv_heads):
            heads = slice(g * group, (g + 1) * group)
            # Rows (head in group, query token), padded per head to whole query tiles: units [heads * tiles, width].
            qs = F.pad(q[q0 : q0 + q_len, heads].double().transpose(0, 1), (0, 0, 0, padded - q_len))
            qs = qs.reshape(-1, width, case.head_dim)
            row_ok = (tok < q_len).repeat(group).view(-1, width)
            q_pos = (kv_len - q_len + tok).repeat(group).view(-1, width)
            ks, vs = k[kv0 : kv0 + kv_len, g].double(), v[kv0 : kv0 + kv_len, g].double()
            blocks = [_block(case, semantics, qs[u : u + per_block], row_ok[u : u + per_block],
                             q_pos[u : u + per_block], ks, vs, block_n, q_len == 1, bound, cap)
                      for u in range(0, qs.shape[0], per_block)]
            for name, out in (("lo", lo), ("hi", hi)):
                rows = torch.cat([getattr(b, name) for b in blocks]).view(group, padded, -1)[:, :q_len]
                out[q0 : q0 + q_len, heads] = rows.transpose(0, 1)
            unit_partial = torch.cat([b.partial for b in blocks])
            partial[q0 : q0 + q_len, heads] = unit_partial.repeat_interleave(width).view(group, padded)[:, :q_len].T
            for i, name in enumerate(("decisions", "boundary", "paths", "rows")):
                totals[i] += sum(getattr(b, name) for b in blocks)
        q0, kv0 = q0 + q_len, kv0 + kv_len
    kind = {"skip_softmax": "skip decisions", "nm": "N:M rank decisions"}.get(sp.mode, "")
    return Envelope(lo, hi, partial, kind, *totals)


def _bytes_per_score(sparsity) -> int:
    # The working set per (row, key), as measured on an H200 (8k keys, 64 heads): a few float64 score-sized tensors
    # and masks; N:M adds grouped copies, score intervals and two [m, m] comparisons per key.
    return 64 + (28 * sparsity.m if sparsity.mode == "nm" else 0)


def _block(case: Case, semantics: SparsitySemantics, qs: torch.Tensor, row_ok: torch.Tensor, q_pos: torch.Tensor,
           ks: torch.Tensor, vs: torch.Tensor, block_n: int, decode: bool, bound: bool, cap: int) -> _Block:
    sp = case.sparsity
    to_log2 = case.scale * LOG2E
    keys = torch.arange(ks.shape[0], device=qs.device)
    valid = row_ok[..., None] & ((keys <= q_pos[..., None]) if case.causal else (keys >= 0))
    s = (qs @ ks.T * to_log2).masked_fill(~valid, NEG)
    err = (qs.abs() @ ks.abs().T * (to_log2 * score_error(case.head_dim))).masked_fill(~valid, 0.0) if bound else None
    top = s.amax(-1, keepdim=True)
    w = torch.exp2(s - top.masked_fill(top == NEG, 0.0))  # 0 for invalid keys; the row's max key weighs 1
    choices = None
    if sp.mode == "nm":
        dense = _window(q_pos[..., None], keys, sp, semantics) | (decode and semantics.nm_dense_decode_rows)
        keep, choices = _nm(s, err, valid, dense, w, vs, sp.n, sp.m, sp.m in semantics.nm_tied_kept, cap)
    elif sp.mode == "skip_softmax":
        keep, choices = _skip(s, err, valid, w, vs, block_n, sp.threshold)
    else:
        keep = valid
    wk = w * keep
    num, den = wk @ vs, wk.sum(-1)
    exact = num / den[..., None]
    if choices is None:
        return _Block(exact, exact, torch.zeros(qs.shape[0], dtype=torch.bool, device=qs.device))
    lo, hi, partial, paths, rows = _widen(exact, num, den, row_ok, choices, cap)
    return _Block(lo, hi, partial, choices.decisions, choices.boundary, paths, rows)


def _window(q_pos: torch.Tensor, keys: torch.Tensor, sp, semantics: SparsitySemantics) -> torch.Tensor:
    recent = keys > q_pos - sp.recent
    if semantics.recent_window == "to_query":
        recent &= keys <= q_pos
    return (keys < sp.sink) | recent


def _groups(x: torch.Tensor, size: int, fill) -> torch.Tensor:
    """The last axis padded with `fill` to whole groups and split into [..., groups, size]."""
    return F.pad(x, (0, -x.shape[-1] % size), value=fill).unflatten(-1, (-1, size))


def _tile_max(x: torch.Tensor, block_n: int, fill: float) -> torch.Tensor:
    return _groups(x, block_n, fill).amax(-1)


def _per_key(per_tile: torch.Tensor, block_n: int, kv_len: int) -> torch.Tensor:
    return per_tile.repeat_interleave(block_n, -1)[..., :kv_len]


def _before(x: torch.Tensor, fill: float) -> torch.Tensor:
    """The max of x over the tiles before each tile (the lemma's running max)."""
    return F.pad(x[..., :-1], (1, 0), value=fill).cummax(-1).values


def _drops(tile_max: torch.Tensor, log2_threshold: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(unit drops [..., 1, tiles], running max, margin) from tile maxima [..., rows of a unit, tiles]."""
    running = _before(tile_max, NEG)
    margin = tile_max - running - log2_threshold
    may_drop = (margin < 0) | (tile_max == NEG)
    return may_drop.all(-2, keepdim=True), running, margin


def _skip(s, err, valid, w, vs, block_n: int, threshold: float) -> tuple[torch.Tensor, _Choices | None]:
    keep = skip_tiles(s, valid, block_n, threshold)
    if err is None:
        return keep, None
    log2_threshold = math.log2(threshold)
    tile_max = _tile_max(s, block_n, NEG)
    drop, running, margin = _drops(tile_max, log2_threshold)
    tile_err = _tile_max(err, block_n, 0.0)
    b = decision_bound(tile_max, running, tile_err, _before(tile_err, 0.0), log2_threshold)
    near = margin.isfinite() & (margin.abs() <= b)
    surely_keeps = (margin >= 0) & ~near
    surely_drops = ((margin < 0) | (tile_max == NEG)) & ~near
    boundary = ~surely_keeps.any(1) & ~surely_drops.all(1)  # [units, tiles]
    interacting = (boundary & (near & (b >= -log2_threshold)).any(1)).any(1)
    unit, t = (boundary & ~interacting[:, None]).nonzero(as_tuple=True)
    # The alternative adds a dropped tile's weights to every row of the unit, or removes a kept one's.
    sign = torch.where(drop[unit, 0, t], 1.0, -1.0)
    wt = _groups(w, block_n, 0.0)[unit, :, t]  # [n, rows of a unit, block_n]
    vt = _groups(vs.T, block_n, 0.0).permute(1, 2, 0)[t]  # [n, block_n, D]
    return keep, _Choices(unit, torch.ones_like(unit), sign[:, None, None] * (wt @ vt), sign[:, None] * wt.sum(-1),
                          interacting, int((tile_max > NEG).any(1).sum()), int(boundary.sum()))


def _nm(s, err, valid, dense, w, vs, n: int, m: int, tied_kept: bool, cap: int) -> tuple[torch.Tensor, _Choices | None]:
    top = nm_keep(s, valid, n, m, tied_kept)
    keep = valid & (top | dense)
    if err is None:
        return keep, None
    sg, eg, ok, dn = _groups(s, m, NEG), _groups(err, m, 0.0), _groups(valid, m, False), _groups(dense, m, False)
    low, high = sg - eg, sg + eg
    other = ~torch.eye(m, dtype=torch.bool, device=s.device)
    # [..., j, i]: key i may score at least key j's lowest / surely beats key j's highest.
    may = (ok[..., None, :] & other & (high[..., None, :] >= low[..., :, None])).sum(-1)
    surely = (ok[..., None, :] & (low[..., None, :] > high[..., :, None])).sum(-1)
    sure = ok & (may < n)
    unsure = ok & ~sure & (surely < n)
    near = (unsure & ~dn).any(-1)  # [units, 1, groups]
    unit, _, g = near.nonzero(as_tuple=True)
    exact = _groups(keep, m, False)[unit, 0, g]
    # A group whose uncertain keys alone could pass the cap is left to its exact choice.
    too_many = unsure[unit, 0, g].sum(-1) > int(math.log2(cap))
    at = (~too_many).nonzero().squeeze(1)
    alt_of, alt_keep = _nm_alternatives(*(x[unit[at], 0, g[at]] for x in (unsure, sure, ok, dn)), exact[at], n,
                                        tied_kept)
    alt_of = at[alt_of]
    partial = torch.zeros(s.shape[0], dtype=torch.bool, device=s.device)
    partial[unit[too_many]] = True
    change = (alt_keep.double() - exact[alt_of].double()) * _groups(w, m, 0.0)[unit[alt_of], 0, g[alt_of]]
    vg = _groups(vs.T, m, 0.0).permute(1, 2, 0)[g[alt_of]]  # [a, m, D]
    return keep, _Choices(unit, torch.bincount(alt_of, minlength=unit.shape[0]), (change[:, None, :] @ vg),
                          change.sum(-1, keepdim=True), partial, int((ok.sum(-1) > n).sum()), int(near.sum()))


def _nm_alternatives(unsure, sure, ok, dense, exact, n: int, tied_kept: bool):
    """(group index, keep mask [a, m]) of every other choice of the uncertain keys of each near-tie group [g, m]:
    the sure keys plus n - |sure| (or more, tied-kept) uncertain ones, differing from the exact choice."""
    count, need = unsure.sum(-1), n - sure.sum(-1)
    # The uncertain keys of each group first, in key order: position p of a subset's bits is key members[:, p].
    members = torch.sort((~unsure).to(torch.uint8), dim=-1, stable=True).indices
    of, masks = [], []
    for c in count.unique().tolist():
        grp = (count == c).nonzero().squeeze(1)
        bits = (torch.arange(2**c, device=unsure.device)[:, None] >> torch.arange(c, device=unsure.device)) & 1
        size = bits.sum(-1)
        fits = (size[None, :] >= need[grp, None]) if tied_kept else (size[None, :] == need[grp, None])
        gi, si = fits.nonzero(as_tuple=True)
        chosen = torch.zeros(gi.shape[0], unsure.shape[-1], dtype=torch.bool, device=unsure.device)
        chosen.scatter_(1, members[grp[gi], :c], bits[si].bool())
        alt = ok[grp[gi]] & (sure[grp[gi]] | chosen | dense[grp[gi]])
        differs = (alt != exact[grp[gi]]).any(-1)
        of.append(grp[gi][differs])
        masks.append(alt[differs])
    if not of:
        return (torch.zeros(0, dtype=torch.long, device=unsure.device),
                torch.zeros(0, unsure.shape[-1], dtype=torch.bool, device=unsure.device))
    of, masks = torch.cat(of), torch.cat(masks)
    order = torch.sort(of, stable=True).indices
    return of[order], masks[order]


def _widen(exact, num, den, row_ok, choices: _Choices, cap: int):
    """(lo, hi, partial units, paths, rows): the exact outputs [units, rows, D] widened over every other path."""
    lo, hi = exact.clone(), exact.clone()
    path_unit, pair_path, pair_alt, capped = _paths(choices.unit, choices.alternatives, exact.shape[0], cap)
    order = torch.sort(pair_path, stable=True).indices
    pair_path, pair_alt = pair_path[order], pair_alt[order]
    per_batch = max(1, CHUNK_BYTES // (8 * exact[0].numel() * 4))
    for p0 in range(0, path_unit.shape[0], per_batch):
        units = path_unit[p0 : p0 + per_batch]
        lo_pair, hi_pair = torch.searchsorted(
            pair_path, torch.tensor([p0, p0 + units.shape[0]], device=pair_path.device)).tolist()
        at, alt = pair_path[lo_pair:hi_pair] - p0, pair_alt[lo_pair:hi_pair]
        d_num = torch.zeros(units.shape[0], *exact.shape[1:], dtype=exact.dtype, device=exact.device)
        d_den = torch.zeros(units.shape[0], exact.shape[1], dtype=exact.dtype, device=exact.device)
        d_num.index_add_(0, at, choices.d_num[alt])
        d_den.index_add_(0, at, choices.d_den[alt])
        out = (num[units] + d_num) / (den[units] + d_den)[..., None]
        at_unit = units[:, None, None].expand_as(out)
        lo.scatter_reduce_(0, at_unit, out, "amin")
        hi.scatter_reduce_(0, at_unit, out, "amax")
    rows = int(row_ok[path_unit.unique()].sum())
    return lo, hi, capped | choices.partial, int(path_unit.shape[0]), rows


def _paths(unit: torch.Tensor, alternatives: torch.Tensor, units: int, cap: int):
    """The paths other than the exact one: (unit of each path, and (path, alternative) pairs, one per choice that
    leaves the exact path; units past `cap`). Per unit the paths are the product of its decisions' choices (the exact
    one or an alternative), in mixed radix; past `cap`, each alternative alone."""
    dev = unit.device
    radix = alternatives + 1
    bits = radix.double().log2()
    log_paths = torch.zeros(units, dtype=torch.float64, device=dev).index_add_(0, unit, bits)
    full_unit = log_paths <= math.log2(cap) + 1e-9
    capped = ~full_unit
    first_alt = torch.cumsum(alternatives, 0) - alternatives
    # Product units: decision d's digit of path p is (p // stride_d) % radix_d, stride_d the product of the radices
    # of the unit's earlier decisions. Paths 1.. of each unit (0 is the exact one).
    excl = torch.cumsum(bits, 0) - bits
    stride = torch.exp2((excl - excl[torch.searchsorted(unit, unit)]).clamp_max(62)).round().long()
    count = torch.exp2(log_paths.clamp_max(62)).round().long().where(full_unit, 0)  # the exact path included
    more = (count - 1).clamp_min(0)
    path_start = torch.cumsum(more, 0) - more
    per_decision = more[unit]
    dec = torch.repeat_interleave(torch.arange(unit.shape[0], device=dev), per_decision)
    p = torch.arange(dec.shape[0], device=dev) - (torch.cumsum(per_decision, 0) - per_decision)[dec] + 1
    digit = (p // stride[dec]) % radix[dec]
    chosen = digit > 0
    pair_path = (path_start[unit[dec]] + p - 1)[chosen]
    pair_alt = (first_alt[dec] + digit - 1)[chosen]
    full_paths = int(more.sum())
    # Capped units: each alternative alone.
    alt_decision = torch.repeat_interleave(torch.arange(unit.shape[0], device=dev), alternatives)
    lone = capped[unit[alt_decision]].nonzero().squeeze(1)
    path_unit = torch.cat([torch.repeat_interleave(torch.arange(units, device=dev), more), unit[alt_decision[lone]]])
    pair_path = torch.cat([pair_path, full_paths + torch.arange(lone.shape[0], device=dev)])
    pair_alt = torch.cat([pair_alt, lone])
    return path_unit, pair_path, pair_alt, capped
