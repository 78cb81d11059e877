"""The oracle's decision envelope (harness.compare.reference.envelope) and the oracle check
(conformance/test_oracle.py).

Soundness is tested against an emulated kernel written the slow, obvious way: per unit, tile by tile, a running max
over the kept tiles, decisions taken on scores moved by up to the stated error bound e_j (or forced the other way at
chosen decisions), weights from the exact scores. Every path the bound allows must lie inside the envelope, some
must leave the exact path (else the test says nothing), and a flip the bound does not allow must be refused. The
two H200 REPRO cases (8192-token prefills) are too big for the CPU interpreter; their configurations at 1024 tokens
stand in (tests/test_builtin.py runs the kernel itself; fixtures/regressions/builtin/ replays them on CUDA).
The planted skip-softmax bugs of kvconform.subjects.mutants run in Triton's interpreter at small sizes.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first triton import

import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from harness.compare import reference  # noqa: E402
from harness.draws.cases import Case, Sparsity  # noqa: E402
from harness.draws.strategies import Example  # noqa: E402
from harness.subjects import SparsitySemantics, TileConfig, semantics_of  # noqa: E402
from harness.subjects.builtin import PREFILL, BuiltinSubject  # noqa: E402
from kvconform.subjects import load_subject  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
from harness.checks import oracle as oracle_check  # noqa: E402

ROW = SparsitySemantics()
QUERY_TILE = SparsitySemantics(skip_decision="query_tile", nm_dense_decode_rows=True, recent_window="to_query",
                               nm_tied_kept=(8,))
# The H200 REPRO cases (oracle differs before the envelope), and their configurations at 1024 tokens.
REPRO = [
    Case((8192,), (8192,), 4, 1, 128, 16, "float16", True, Sparsity("skip_softmax", threshold=0.7), seed=65),
    Case((8192,), (8192,), 8, 1, 128, 16, "float16", True, Sparsity("skip_softmax", threshold=0.3), seed=0),
]
REPRO_SMALL = [dataclasses.replace(c, q_lens=(1024,), kv_lens=(1024,)) for c in REPRO]


# ---- the emulated kernel --------------------------------------------------------------------------------------


def scores(case: Case, q, k, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact log2-unit scores and their error bounds e of one sequence, [heads, q_len, kv_len]; masked keys -inf, 0."""
    q0, kv0 = sum(case.q_lens[:seq]), sum(case.kv_lens[:seq])
    q_len, kv_len = case.q_lens[seq], case.kv_lens[seq]
    group = case.num_heads // case.kv_heads
    qs = q[q0 : q0 + q_len].double().transpose(0, 1)
    ks = k[kv0 : kv0 + kv_len].double().repeat_interleave(group, 1).transpose(0, 1)
    to_log2 = case.scale * math.log2(math.e)
    s = qs @ ks.transpose(1, 2) * to_log2
    e = qs.abs() @ ks.abs().transpose(1, 2) * to_log2 * reference.score_error(case.head_dim)
    if case.causal:
        masked = torch.arange(kv_len)[None, :] > torch.arange(kv_len - q_len, kv_len)[:, None]
        s, e = s.masked_fill(masked, -math.inf), e.masked_fill(masked, 0.0)
    return s, e


def emulate(case: Case, q, k, v, tile: TileConfig, semantics: SparsitySemantics, delta=None, flip=()):
    """One decision path's float64 output [total_q, H, D]: decisions on scores + delta[seq] ([H, q_len, kv_len]),
    and forced the other way at each (seq, head, unit, tile) in `flip` (skip) or (seq, head, row, group) (N:M)."""
    out = []
    for seq, (q_len, kv_len) in enumerate(zip(case.q_lens, case.kv_lens)):
        s, _ = scores(case, q, k, seq)
        seen = s + (delta[seq] if delta is not None else 0.0)
        if case.sparsity.mode == "skip_softmax":
            keep = torch.stack([_skip_path(case, seen[h], tile, semantics, {f[2:] for f in flip if f[:2] == (seq, h)})
                                for h in range(case.num_heads)])
        elif case.sparsity.mode == "nm":
            keep = torch.stack([_nm_path(case, seen[h], q_len, kv_len, semantics,
                                         {f[2:] for f in flip if f[:2] == (seq, h)}) for h in range(case.num_heads)])
        else:
            keep = s > -math.inf
        w = torch.exp2(s - s.amax(-1, keepdim=True)) * keep
        kv0 = sum(case.kv_lens[:seq])
        vs = v[kv0 : kv0 + kv_len].double().repeat_interleave(case.num_heads // case.kv_heads, 1).transpose(0, 1)
        out.append(((w @ vs) / w.sum(-1, keepdim=True)).transpose(0, 1))
    return torch.cat(out)


def _skip_path(case: Case, seen, tile: TileConfig, semantics: SparsitySemantics, flips):
    q_len, kv_len = seen.shape
    width = tile.block_m if semantics.skip_decision == "query_tile" else 1
    units = -(-q_len // width)
    rows = torch.cat([seen, seen.new_full((units * width - q_len, kv_len), -math.inf)]).view(units, width, kv_len)
    forced = torch.zeros(units, -(-kv_len // tile.block_n), dtype=torch.bool)
    for unit, t in flips:
        forced[unit, t] = True
    running = torch.full((units, width), -math.inf, dtype=torch.float64)
    keep = torch.zeros(units, kv_len, dtype=torch.bool)
    for t, key in enumerate(range(0, kv_len, tile.block_n)):
        tile_max = rows[:, :, key : key + tile.block_n].amax(-1)
        may_drop = (tile_max == -math.inf) | (tile_max - running < math.log2(case.sparsity.threshold))
        kept = may_drop.all(1) == forced[:, t]
        keep[kept, key : key + tile.block_n] = True
        running = torch.where(kept[:, None], torch.maximum(running, tile_max), running)
    return keep.repeat_interleave(width, 0)[:q_len] & (seen > -math.inf)


def _nm_path(case: Case, seen, q_len: int, kv_len: int, semantics: SparsitySemantics, flips):
    sp = case.sparsity
    q_pos = torch.arange(kv_len - q_len, kv_len)[:, None]
    keys = torch.arange(kv_len)[None, :]
    to_kv_end = semantics.recent_window == "to_kv_end"
    dense = (keys < sp.sink) | ((keys > q_pos - sp.recent) & ((keys <= q_pos) | to_kv_end))
    if semantics.nm_dense_decode_rows and q_len == 1:
        dense |= True
    keep = torch.zeros_like(seen, dtype=torch.bool)
    for g, key in enumerate(range(0, kv_len, sp.m)):
        group = seen[:, key : key + sp.m]
        order = torch.sort(group, dim=-1, descending=True, stable=True).indices  # ties: the lower key first
        top = torch.zeros_like(group, dtype=torch.bool).scatter_(1, order[:, : sp.n], True)
        if sp.m in semantics.nm_tied_kept and group.shape[1] >= sp.n:
            top = group >= group.gather(1, order[:, sp.n - 1 : sp.n])
        for r, _ in [f for f in flips if f[1] == g]:  # the n-th and the (n+1)-th swap places
            top[r] = False
            top[r, order[r, : sp.n - 1]] = True
            top[r, order[r, sp.n]] = True
        keep[:, key : key + sp.m] = top
    return (keep | dense) & (seen > -math.inf)


def margins(case: Case, q, k, tile: TileConfig, seq: int, head: int):
    """Per (row, tile) of one head: the exact margin and the bound B, computed the obvious way (loop over tiles)."""
    s, e = scores(case, q, k, seq)
    s, e = s[head], e[head]
    log2_threshold = math.log2(case.sparsity.threshold)
    running = torch.full((s.shape[0],), -math.inf, dtype=torch.float64)
    running_err = torch.zeros(s.shape[0], dtype=torch.float64)
    out = []
    for key in range(0, s.shape[1], tile.block_n):
        tile_max, tile_err = s[:, key : key + tile.block_n].amax(-1), e[:, key : key + tile.block_n].amax(-1)
        margin = tile_max - running - log2_threshold
        out.append((margin, reference.decision_bound(tile_max, running, tile_err, running_err, log2_threshold)))
        kept = ~((tile_max == -math.inf) | (margin < 0))
        running = torch.where(kept, torch.maximum(running, tile_max), running)
        running_err = torch.maximum(running_err, tile_err)
    return torch.stack([m for m, _ in out], 1), torch.stack([b for _, b in out], 1)


def half(x: torch.Tensor) -> torch.Tensor:
    return x.half()  # what a subject returns: its output rounded to the input dtype


def judge(case, out, q, k, v, tile, semantics=ROW):
    return oracle_check.judge(case, out, q, k, v, tile, semantics)


# ---- the envelope holds every allowed path, and only those --------------------------------------------------------


@pytest.mark.parametrize("case", REPRO_SMALL, ids=["repro_h4_t07_s65", "repro_h8_t03_s0"])
def test_repro_configurations_pass_on_any_allowed_path_and_fail_on_a_real_flip(case):
    q, k, v = case.inputs()
    tile = PREFILL
    env = reference.envelope(case, q, k, v, tile)
    assert env.boundary > 0, "no boundary decision: the test would say nothing"
    exact = reference.attention(case, q, k, v, tile)
    assert bool((env.lo <= exact).all() & (exact <= env.hi).all())
    tol = oracle_check.tolerance(case.torch_dtype, v)
    head, near, far = _decisions(case, q, k, tile)

    def flipped(decision):
        """The verdict on a kernel output that took `decision` (row, tile) the other way; the flip must show."""
        row, t = decision
        output = emulate(case, q, k, v, tile, ROW, flip={(0, head, row, t)})
        assert (output[row, head] - exact[row, head]).abs().max() > tol
        return judge(case, half(output), q, k, v, tile)

    # One boundary decision flipped: the plain tolerance around the exact path refuses it, the envelope takes it.
    verdict = flipped(near)
    assert verdict.word == "within-tolerance", verdict.diagnosis
    assert f"within the error bound: {env.boundary:,} of {env.decisions:,}" in verdict.diagnosis
    # A decision far outside its bound flipped: a real error.
    verdict = flipped(far)
    assert verdict.word == "differs", verdict.diagnosis
    assert f"(token, head, dim) ({far[0]}, {head}," in verdict.diagnosis


def _decisions(case: Case, q, k, tile: TileConfig):
    """(head, a boundary decision (row, tile) whose flip shows, a decision 100 bounds from its threshold)."""
    for head in range(case.num_heads):
        margin, bound = margins(case, q, k, tile, 0, head)
        near = (margin.isfinite() & (margin.abs() <= bound)).nonzero().tolist()
        # Kept tiles below the running max (so the flip leaves later decisions alone), far from the threshold.
        far = ((margin > 100 * bound) & (margin < -math.log2(case.sparsity.threshold))).nonzero().tolist()
        if near and far:
            return head, near[0], far[len(far) // 2]
    raise AssertionError("no boundary decision: the test would say nothing")


def twins(k: torch.Tensor) -> torch.Tensor:
    """k with keys 1, 17, 33, ... copies of the key before, nudged by one fp16 step in one dimension: pairs that
    score within the error bound of each other for every query (near-ties wherever they meet the rank-n boundary)."""
    k = k.clone()
    k[1::16] = k[0::16][: k[1::16].shape[0]]
    k[1::16, :, 0] = torch.nextafter(k[1::16, :, 0], torch.tensor(math.inf, dtype=k.dtype))
    return k


def near_threshold(case: Case, q, k, tile: TileConfig, semantics: SparsitySemantics) -> float:
    """A threshold that puts one unit decision (a tile at least 1 below the running max) at margin B/10: a boundary
    decision that the error bound lets go either way."""
    width = tile.block_m if semantics.skip_decision == "query_tile" else 1
    log2_threshold = math.log2(case.sparsity.threshold)
    best = (math.inf, 0.0)
    for seq in range(len(case.q_lens)):
        for head in range(case.num_heads):
            margin, bound = margins(case, q, k, tile, seq, head)
            pad = -margin.shape[0] % width
            margin = torch.cat([margin, margin.new_full((pad, margin.shape[1]), -math.inf)]).unflatten(0, (-1, width))
            bound = torch.cat([bound, bound.new_zeros(pad, bound.shape[1])]).unflatten(0, (-1, width))
            unit_margin, at = margin.max(1)  # a unit keeps a tile when one of its rows does
            unit_bound = bound.gather(1, at[:, None]).squeeze(1)
            below = unit_margin.isfinite() & (unit_margin < -log2_threshold - 1)
            below[:, 0] = False
            for u, t in below.nonzero().tolist():
                if abs(unit_margin[u, t]) < best[0]:
                    best = (abs(unit_margin[u, t]), float(unit_margin[u, t] - unit_bound[u, t] / 10))
    return 2 ** (log2_threshold + best[1])


def prepared(case: Case, semantics: SparsitySemantics, q_factor: float, tile: TileConfig):
    """(case, q, k, v) with boundary decisions in it: twin keys for N:M, a threshold at one margin for skip."""
    q, k, v = case.inputs()
    q = (q.float() * q_factor).to(q.dtype)
    if case.sparsity.mode == "nm":
        return case, q, twins(k), v
    threshold = near_threshold(case, q, k, tile, semantics)
    return dataclasses.replace(case, sparsity=Sparsity("skip_softmax", threshold=threshold)), q, k, v


SOUNDNESS = [
    ("row", Case((100, 1, 37), (100, 300, 90), 4, 2, 128, 16, causal=True,
                 sparsity=Sparsity("skip_softmax", threshold=0.7), seed=3), ROW, 3.0),
    ("row_noncausal", Case((20,), (330,), 2, 1, 64, 16, causal=False,
                           sparsity=Sparsity("skip_softmax", threshold=0.95), seed=4), ROW, 1.0),
    ("query_tile", Case((150, 1), (150, 260), 2, 1, 128, 16, causal=True,
                        sparsity=Sparsity("skip_softmax", threshold=0.3), seed=5), QUERY_TILE, 3.0),
    ("nm_m4", Case((30,), (200,), 2, 1, 128, 16, causal=True,
                   sparsity=Sparsity("nm", n=2, m=4, sink=3, recent=5), seed=6), ROW, 1.0),
    ("nm_m8_tied_kept", Case((30, 1), (120, 77), 2, 1, 64, 16, causal=False,
                             sparsity=Sparsity("nm", n=3, m=8, sink=2, recent=6), seed=7), QUERY_TILE, 1.0),
]


@pytest.mark.parametrize("name, case, semantics, q_factor", SOUNDNESS, ids=[s[0] for s in SOUNDNESS])
def test_every_path_the_bound_allows_is_inside_the_envelope(name, case, semantics, q_factor):
    tile = TileConfig(64, 32)
    case, q, k, v = prepared(case, semantics, q_factor, tile)
    env = reference.envelope(case, q, k, v, tile, semantics)
    assert env.boundary > 0, "no boundary decision: the test would say nothing"
    exact = reference.attention(case, q, k, v, tile, semantics)
    assert torch.allclose(emulate(case, q, k, v, tile, semantics), exact, rtol=0, atol=1e-12)
    errors = [scores(case, q, k, seq)[1] for seq in range(len(case.q_lens))]
    g = torch.Generator().manual_seed(0)
    left = 0
    for trial in range(24):
        # Uniform within the bound, or at its ends (where flips happen).
        pick = [torch.rand(e.shape, generator=g, dtype=torch.float64) * 2 - 1 for e in errors]
        if trial % 4:
            pick = [p.sign() for p in pick]
        out = emulate(case, q, k, v, tile, semantics, [p * e for p, e in zip(pick, errors)])
        assert bool((out >= env.lo - 1e-12).all() & (out <= env.hi + 1e-12).all()), trial
        left += int(((out - exact).abs() > 1e-9).any())
    assert left > 0, "no emulated path left the exact one: the test would say nothing"


def test_a_near_tie_swap_is_accepted_and_a_far_one_refused():
    # Keys 0 and 1 score within the error bound of each other (key 1 is key 0 nudged by one fp16 step in one
    # dimension) and above keys 2, 3 (their negatives): which of them a 1:4 group keeps is the kernel's rounding.
    case = Case((1,), (8,), 1, 1, 64, 16, causal=True, sparsity=Sparsity("nm", n=1, m=4))
    q, k, v = case.inputs()
    k = k.clone()
    k[0] *= torch.sign(q[0, 0].float() @ k[0, 0].float()).half()
    k[1] = k[0]
    k[1, 0, 0] = torch.nextafter(k[0, 0, 0], torch.tensor(math.inf, dtype=k.dtype))
    k[2], k[3] = -k[0], -k[1]
    tile = TileConfig(16, 64)
    env = reference.envelope(case, q, k, v, tile)
    assert (env.boundary, env.decisions) == (1, 2)
    tol = oracle_check.tolerance(case.torch_dtype, v)
    swapped = emulate(case, q, k, v, tile, ROW, flip={(0, 0, 0, 0)})
    assert (swapped - env.lo).abs().max() > tol
    verdict = judge(case, half(swapped), q, k, v, tile)
    assert verdict.word == "within-tolerance" and verdict.diagnosis.startswith(
        "N:M rank decisions within the error bound: 1 of 2 (5.0e-01); envelope of 1 more paths over 1 rows")
    far = emulate(case, q, k, v, tile, ROW, flip={(0, 0, 0, 1)})  # group 1's top two are no near tie
    assert (far - env.lo).abs().max() > tol
    assert judge(case, half(far), q, k, v, tile).word == "differs"


def test_past_the_path_cap_the_envelope_is_partial_and_says_so():
    tile = TileConfig(64, 32)
    case, q, k, v = prepared(*SOUNDNESS[3][1:], tile)
    full = reference.envelope(case, q, k, v, tile)
    capped = reference.envelope(case, q, k, v, tile, cap=1)
    assert not full.partial.any() and capped.partial.any()
    assert (capped.lo >= full.lo).all() and (capped.hi <= full.hi).all()
    assert "partial" in capped.describe()


def test_without_sparsity_the_envelope_is_the_oracle():
    case = Case((5, 1), (40, 9), 4, 2, 64, 16)
    q, k, v = case.inputs()
    env = reference.envelope(case, q, k, v, PREFILL)
    assert torch.equal(env.lo, env.hi) and env.describe() == "" and not env.partial.any()
    assert torch.equal(env.lo, reference.attention(case, q, k, v, PREFILL))


@pytest.mark.parametrize("name, case, semantics, q_factor", SOUNDNESS[2:4], ids=[s[0] for s in SOUNDNESS[2:4]])
def test_blocks_of_units_give_the_same_envelope(monkeypatch, name, case, semantics, q_factor):
    tile = TileConfig(64, 32)
    case, q, k, v = prepared(case, semantics, q_factor, tile)
    whole = reference.envelope(case, q, k, v, tile, semantics)
    monkeypatch.setattr(reference, "CHUNK_BYTES", 1)  # one unit per block
    pieces = reference.envelope(case, q, k, v, tile, semantics)
    assert torch.allclose(whole.lo, pieces.lo, rtol=0, atol=1e-12)
    assert torch.allclose(whole.hi, pieces.hi, rtol=0, atol=1e-12)
    assert whole.describe() == pieces.describe()


def test_query_tile_decisions_need_the_tile_config():
    case = SOUNDNESS[2][1]
    with pytest.raises(ValueError, match="block_m"):
        reference.envelope(case, *case.inputs(), 32, QUERY_TILE)


# ---- the REPRO cases are kept to replay on CUDA ---------------------------------------------------------------


def test_repro_regressions_are_kept_for_cuda():
    from harness.recordings import store

    contract = store.load("0.33.0").contracts[0]
    kept = sorted((ROOT / "fixtures" / "regressions" / "builtin").glob("oracle-*.json"))
    bodies = [json.loads(p.read_text()) for p in kept]
    cases = {Example.from_json(json.dumps(b["example"])).case: b for b in bodies}
    for case in REPRO:
        body = cases[case]
        ex = Example.from_json(json.dumps(body["example"]))
        assert (body["check"], body["subject"], body["release"], body["geometry"], body["device"]) == (
            "oracle", "builtin", "0.33.0", "dense", "cuda")
        assert ex.contract == contract and body["case"] == repr(case)
        assert kept[bodies.index(body)].name == f"oracle-{ex.digest()}.json"


# ---- subject-declared semantics and planted bugs ----------------------------------------------------------------


def test_semantics_are_declared_and_validated():
    assert semantics_of(BuiltinSubject()) == SparsitySemantics() == ROW
    assert semantics_of(object()) == ROW
    with pytest.raises(ValueError, match="skip_decision"):
        SparsitySemantics(skip_decision="block")
    with pytest.raises(ValueError, match="recent_window"):
        SparsitySemantics(recent_window="both")


def test_mutants_load_by_prefix_and_module_class_still_works():
    subject = load_subject("mutant:skip_running_max")
    assert subject.name == "builtin[mutant skip_running_max]" and semantics_of(subject) == ROW
    assert type(load_subject("harness.subjects.builtin:BuiltinSubject")).__name__ == "BuiltinSubject"
    with pytest.raises(ValueError, match="unknown mutant 'nope'"):
        load_subject("mutant:nope")
    with pytest.raises(ValueError, match="mutant:<name>"):
        load_subject("nope")


# Small skip-softmax cases whose rows skip tiles and keep later ones (q scaled up to spread the scores).
PLANTED = [
    Case((20,), (260,), 2, 1, 64, 64, sparsity=Sparsity("skip_softmax", threshold=0.5)),
    Case((1, 1), (400, 90), 4, 2, 64, 16, sparsity=Sparsity("skip_softmax", threshold=0.5)),
]


@pytest.mark.parametrize("name", [None, "skip_threshold_ln", "skip_running_max", "skip_per_query_tile"])
def test_the_oracle_catches_each_planted_skip_bug(name):
    subject = BuiltinSubject() if name is None else load_subject(f"mutant:{name}")
    words = []
    for case in PLANTED:
        q, k, v = case.inputs()
        q = (q.float() * 4).to(q.dtype)
        tile = subject.tile_config(case)
        out = subject.dense_forward(case, q, k, v, tile)
        words.append(judge(case, out, q, k, v, tile, semantics_of(subject)).word)
    assert words == (["within-tolerance"] * 2 if name is None else ["differs"] * 2)
