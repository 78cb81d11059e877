"""The built-in subject: agrees with the float64 oracle, paged is bit-identical to dense over every contract, bad
input is refused before any launch, and each planted bug is caught by the check meant for it.

Runs on the CPU through Triton's interpreter by default (tiny shapes). KVCONFORM_DEVICE=cuda runs the same tests
on the GPU and adds realistic batches (32 heads / 8 kv heads / head dim 128, KV up to 8k, mixed batches of 10).
"""

import os

DEVICE = os.environ.get("KVCONFORM_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first triton import

import dataclasses  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from harness.compare import (  # noqa: E402
    assert_bit_identical,
    diagnose,
    reference,  # noqa: E402
)
from harness.contract import Contract, Dims, cross_layer, families, views  # noqa: E402
from harness.draws.cases import Case, Sparsity  # noqa: E402
from harness.handed.cache import Paging, paging, write  # noqa: E402
from harness.subjects import builtin  # noqa: E402
from harness.subjects.builtin import BuiltinSubject  # noqa: E402
from kvconform.subjects.mutants import MUTANTS, Mutant, mutant_subject, mutated_source  # noqa: E402

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("KVCONFORM_DEVICE=cuda but no CUDA device", allow_module_level=True)

CUDA = DEVICE == "cuda"
SUBJECT = BuiltinSubject()
CONTRACTS = families() + [cross_layer(families()[0], True), cross_layer(families()[5], False)]
NHD_KV_FIRST = families()[0]
assert NHD_KV_FIRST.layout.order == "NHD" and NHD_KV_FIRST.layout.family == "kv-first"

# Why these tolerances: scores, softmax and the PV accumulation run in fp32, so what remains is rounding to the
# input dtype: each probability is rounded to the dtype before the PV product (relative error <= u, so <= u*max|V|
# in the output), the fp32 normalizer uses the unrounded probabilities (another <= u*max|V|), and the output is
# rounded once (<= u*|out| <= u*max|V|). 4*u*max|V| bounds that with margin, u being the unit roundoff: 2^-11
# for fp16, 2^-8 for bf16. fp32 runs IEEE dots; there the bound is fp32 rounding over the 256-term sums and the
# GPU's approximate exp2 (2 ulp), well under 2^-18. A real bug (a wrong key, head or mask) moves outputs by O(1).
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-18}


def tolerance(case: Case, v: torch.Tensor) -> float:
    return 4 * UNIT_ROUNDOFF[case.dtype] * v.abs().max().item()


def mixed(**kw) -> Case:
    """A small varlen batch: decode, chunked prefill, full prefill; fp16, GQA, head dim 80 (masked to 128)."""
    base = Case(q_lens=(1, 7, 16), kv_lens=(150, 40, 16), num_heads=4, kv_heads=2, head_dim=80, block_size=16)
    return dataclasses.replace(base, **kw)


SKIP = Sparsity("skip_softmax", threshold=0.5)
NM = Sparsity("nm", n=2, m=4, sink=3, recent=8)
# name -> (case, factor on q): a larger q spreads scores so skip-softmax really drops tiles.
ORACLE_CASES = {
    "prefill_gqa_d64_fp16": (Case((17,), (17,), 4, 2, 64, 16), 1.0),
    "chunked_mqa_d80_bf16": (Case((5, 9), (37, 70), 4, 1, 80, 32, "bfloat16"), 1.0),
    "decode_split_d96_fp16": (Case((1, 1, 1), (300, 5, 129), 4, 2, 96, 48), 1.0),
    "mixed_noncausal_d128_fp32": (Case((1, 6, 20), (40, 6, 33), 6, 3, 128, 16, "float32", causal=False), 1.0),
    "decode_mha_d256_bf16": (Case((1, 2), (50, 70), 2, 2, 256, 256, "bfloat16"), 1.0),
    "skip_chunked_fp16": (Case((20,), (260,), 2, 1, 64, 64, sparsity=SKIP), 6.0),
    "skip_decode_bf16": (Case((1, 1), (400, 90), 4, 2, 64, 16, "bfloat16", sparsity=SKIP), 6.0),
    "skip_noncausal_fp16": (Case((9,), (200,), 2, 2, 80, 16, causal=False, sparsity=SKIP), 6.0),
    "nm_chunked_fp16": (Case((20,), (150,), 4, 2, 64, 16, sparsity=NM), 1.0),
    "nm_decode_split_bf16": (
        Case((1, 1), (200, 64), 4, 2, 64, 32, "bfloat16", sparsity=Sparsity("nm", n=1, m=8)), 1.0),
    "nm_noncausal_fp16": (Case((12,), (40,), 2, 1, 96, 16, causal=False, sparsity=Sparsity("nm", 0, 3, 16, 1, 4)),
                          1.0),
}
if CUDA:
    BIG = dict(num_heads=32, kv_heads=8, head_dim=128, block_size=16)
    BIG_LENS = dict(q_lens=(1, 1, 64, 1, 256, 1, 33, 1, 1, 128), kv_lens=(8192, 4096, 2048, 1, 1024, 3000, 5000, 17,
                                                                           8192, 128))
    ORACLE_CASES |= {
        "big_mixed_fp16": (Case(**BIG_LENS, **BIG), 1.0),
        "big_mixed_bf16_nm": (Case(**BIG_LENS, **BIG, dtype="bfloat16", sparsity=NM), 1.0),
        "big_mixed_skip": (Case(**BIG_LENS, **BIG, sparsity=Sparsity("skip_softmax", threshold=0.05)), 3.0),
        "big_decode_fp16": (Case((1,) * 16, (4096,) * 8 + (8192, 1, 77, 513, 2048, 4000, 16, 300), **BIG), 1.0),
    }


def inputs(case: Case, q_factor: float = 1.0):
    q, k, v = case.inputs(DEVICE)
    return (q.float() * q_factor).to(q.dtype), k, v


def paged_run(subject, case: Case, contract: Contract, q, k, v, order: str = "shuffled", layers: int = 1):
    """The paged forward over `contract`'s K/V views of a fresh NaN-poisoned cache holding k, v (plus spare pages)."""
    dims = Dims(case.blocks_needed() + 5, case.block_size, case.kv_heads, case.head_dim,
                num_layers=layers, layer=layers // 2)
    kv_cache = views.allocate(contract, dims, case.torch_dtype, DEVICE)
    k_cache, v_cache = views.split(contract, kv_cache, dims)
    pages = paging(case.kv_lens, case.block_size, dims.num_blocks, order, seed=case.seed).to(DEVICE)
    write(k_cache, v_cache, pages, k, v)
    return subject.paged_forward(case, q, k_cache, v_cache, pages, subject.tile_config(case))


def oracle_error(case: Case, out: torch.Tensor, q, k, v) -> float:
    ref = reference.attention(case, q, k, v, SUBJECT.tile_config(case).block_n)
    assert not out.isnan().any(), "output holds NaN"
    return (out.double() - ref).abs().max().item()


@pytest.mark.parametrize("name", list(ORACLE_CASES))
def test_matches_oracle(name):
    case, q_factor = ORACLE_CASES[name]
    assert SUBJECT.supports(case) is None
    q, k, v = inputs(case, q_factor)
    out = SUBJECT.dense_forward(case, q, k, v, SUBJECT.tile_config(case))
    assert oracle_error(case, out, q, k, v) <= tolerance(case, v)
    paged = paged_run(SUBJECT, case, NHD_KV_FIRST, q, k, v)
    assert_bit_identical(paged, out, f"{name} paged vs dense")


@pytest.mark.parametrize("name", [n for n, (c, _) in ORACLE_CASES.items() if c.sparsity.mode != "none"])
def test_sparsity_changes_the_output(name):
    # Guards the sparse oracle cases against vacuity: a kernel that ignored the sparse mode would fail
    # test_matches_oracle on them, since the sparse output is farther than the tolerance from the full one.
    case, q_factor = ORACLE_CASES[name]
    q, k, v = inputs(case, q_factor)
    block_n = SUBJECT.tile_config(case).block_n
    sparse = reference.attention(case, q, k, v, block_n)
    full = reference.attention(dataclasses.replace(case, sparsity=Sparsity()), q, k, v, block_n)
    assert (sparse - full).abs().max().item() > tolerance(case, v)


def bit_identity_cases() -> list[Case]:
    cases = [mixed(sparsity=s) for s in (Sparsity(), SKIP, NM)]
    if CUDA:
        cases += [Case(**BIG_LENS, **BIG, sparsity=s) for s in (Sparsity(), NM)]
        cases += [Case((2048,) * 8, (2048,) * 8, **BIG), Case((1,) * 64, (4096,) * 64, **BIG)]
    return cases


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name)
@pytest.mark.parametrize("case", bit_identity_cases(), ids=lambda c: f"{c.sparsity.mode}-{len(c.q_lens)}seqs-"
                                                                    f"{max(c.kv_lens)}kv")
def test_paged_bit_identical_to_dense(contract, case):
    q_factor = 6.0 if case.sparsity.mode == "skip_softmax" else 1.0
    q, k, v = inputs(case, q_factor)
    dense = SUBJECT.dense_forward(case, q, k, v, SUBJECT.tile_config(case))
    for order in ("shuffled", "reversed"):
        paged = paged_run(SUBJECT, case, contract, q, k, v, order, layers=3 if contract.layout.shared else 1)
        assert_bit_identical(paged, dense, f"{contract.describe()} pages {order}, case {case}")


def test_split_kv_is_exercised():
    # The oracle cases cover split and unsplit launches alike.
    splits = {builtin.num_splits(c, SUBJECT.tile_config(c)) for c, _ in ORACLE_CASES.values()}
    assert 1 in splits and max(splits) > 1


# Bad input: refused with the shapes in the message, and before any launch.
@pytest.fixture
def no_launch(monkeypatch):
    def launched(*args, **kwargs):
        raise AssertionError("kernel launched on bad input")

    monkeypatch.setattr(builtin, "launch", launched)


def _paged_inputs(case: Case, dtype=None):
    q, k, v = case.inputs()
    dims = Dims(case.blocks_needed() + 1, case.block_size, case.kv_heads, case.head_dim)
    kv_cache = views.allocate(NHD_KV_FIRST, dims, dtype or case.torch_dtype)
    k_cache, v_cache = views.split(NHD_KV_FIRST, kv_cache)
    return q, k_cache, v_cache, paging(case.kv_lens, case.block_size, dims.num_blocks)


def test_dtype_mismatch_is_refused(no_launch):
    case = mixed()
    q, k_cache, v_cache, pages = _paged_inputs(case, torch.bfloat16)
    with pytest.raises(ValueError, match=r"neither that nor one fp8 type.*q \(24, 4, 80\) torch.float16.*k \(\d+, 16, 2, 80\) "
                                         r"torch.bfloat16"):
        SUBJECT.paged_forward(case, q, k_cache, v_cache, pages, None)
    q, k, v = case.inputs()
    with pytest.raises(ValueError, match=r"neither that nor one fp8 type.*v \(206, 2, 80\) torch.float32"):
        SUBJECT.dense_forward(case, q, k, v.float(), None)


def test_unsupported_head_dim_is_refused(no_launch):
    case = mixed(head_dim=72)
    assert "head_dim 72 not supported" in SUBJECT.supports(case)
    q, k, v = case.inputs()
    with pytest.raises(ValueError, match=r"head_dim 72 not supported.*q \(24, 4, 72\)"):
        SUBJECT.dense_forward(case, q, k, v, None)


def test_short_block_table_is_refused(no_launch):
    case = mixed()
    q, k_cache, v_cache, pages = _paged_inputs(case)
    short = Paging(pages.block_table[:, :3], pages.slot_mapping, pages.kv_lens, pages.block_size)
    with pytest.raises(ValueError, match=r"block table \(3, 3\) too short for sequence 0: kv_len 150 needs 10 pages "
                                         r"of 16 tokens, the table gives 3"):
        SUBJECT.paged_forward(case, q, k_cache, v_cache, short, None)


def test_padding_page_inside_a_sequence_is_refused(no_launch):
    case = mixed()
    q, k_cache, v_cache, pages = _paged_inputs(case)
    table = pages.block_table.clone()
    table[1, 1] = -1
    with pytest.raises(ValueError, match=r"row 1 \(kv_len 40, 3 pages\) holds pages \[\d+, -1, \d+\]"):
        SUBJECT.paged_forward(case, q, k_cache, v_cache, dataclasses.replace(pages, block_table=table), None)


def test_non_unit_innermost_stride_is_refused(no_launch):
    case = mixed()
    q, _, _, pages = _paged_inputs(case)
    wide = torch.zeros(case.blocks_needed() + 1, 16, 2, 160, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"k innermost \(head_dim\) stride is 2.*shape \(\d+, 16, 2, 80\) strides "
                                         r"\(5120, 320, 160, 2\)"):
        SUBJECT.paged_forward(case, q, wide[..., ::2], wide[..., 1::2], pages, None)


# Planted bugs: which check catches which.
def test_every_mutant_line_is_in_the_kernel():
    for mutant in MUTANTS.values():
        assert mutant.replacement in mutated_source(mutant)


def test_a_rotted_mutant_raises():
    with pytest.raises(LookupError, match="occurs 0 times"):
        mutated_source(Mutant("rotted", "q_pos = kv_len - q_len + tok - 7", "q_pos = 0"))


def planted(case: Case, q, k, v, offset: int = 0, kv_head_of=None) -> torch.Tensor:
    """Float64 attention (dense, causal, no sparsity) as a planted bug computes it: every query `offset` positions
    later than it is, query head h reading kv head `kv_head_of(h)` (h // group when None)."""
    group = case.num_heads // case.kv_heads
    heads = [kv_head_of(h) if kv_head_of else h // group for h in range(case.num_heads)]
    out, q0, k0 = [], 0, 0
    for ql, kl in zip(case.q_lens, case.kv_lens):
        qs = q[q0:q0 + ql].double().transpose(0, 1)
        ks, vs = (t[k0:k0 + kl].double()[:, heads].transpose(0, 1) for t in (k, v))
        s = qs @ ks.transpose(1, 2) * case.scale
        later = torch.arange(kl, device=s.device)[None, :] > (kl - ql + offset + torch.arange(ql, device=s.device))[:, None]
        out.append((s.masked_fill(later, float("-inf")).softmax(-1) @ vs).transpose(0, 1))
        q0, k0 = q0 + ql, k0 + kl
    return torch.cat(out)


# What each oracle-caught mutant computes instead, in planted()'s terms.
PLANTED = {"gqa_mapping": dict(kv_head_of=lambda h: h % 2), "causal_offset": dict(offset=1)}


@pytest.mark.parametrize("name", ["gqa_mapping", "causal_offset"])
def test_oracle_catches_bugs_that_hit_both_modes(name):
    # Chunked prefill with two kv heads of two query heads each.
    case = Case((5, 3), (40, 20), 4, 2, 64, 16)
    q, k, v = inputs(case)
    subject = mutant_subject(name)
    dense = subject.dense_forward(case, q, k, v, subject.tile_config(case))
    # Paged and dense share the bug, so bit-identity cannot see it ...
    assert_bit_identical(paged_run(subject, case, NHD_KV_FIRST, q, k, v), dense)
    # ... but the oracle does, by a margin derived from these inputs rather than a fixed factor: the mutant computes
    # the bug's semantics to within the rounding tolerance, and those are `moved` away from the right output, so the
    # oracle error is at least moved - tolerance; the bug is caught when that exceeds the oracle's tolerance.
    tol = tolerance(case, v)
    bug = planted(case, q, k, v, **PLANTED[name])
    assert (dense.double() - bug).abs().max().item() <= tol  # the mutant is the bug planted() describes
    moved = (bug - planted(case, q, k, v)).abs().max().item()
    assert moved - tol > tol, (moved, tol)
    assert oracle_error(case, dense, q, k, v) >= moved - tol


@pytest.mark.parametrize("block_size", [16, 48, 128], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("name", ["table_row", "kv_stride_axis"])
def test_bit_identity_catches_paging_bugs(name, block_size):
    # The kernel finds a key's page three ways (a tile spans whole pages, a page holds whole tiles, neither): one
    # block size each, with keys past the first tile of a page. Equal lengths keep the wrong table row inside real
    # pages; kv_heads <= block_size keeps the swapped strides inside the allocation (NHD order).
    case = Case((3, 3), (100, 100), 4, 2, 64, block_size)
    q, k, v = inputs(case)
    subject = mutant_subject(name)
    dense = subject.dense_forward(case, q, k, v, subject.tile_config(case))
    assert oracle_error(case, dense, q, k, v) <= tolerance(case, v)  # the dense path is untouched
    diagnosis = diagnose(paged_run(subject, case, NHD_KV_FIRST, q, k, v), dense)
    # Bit-identity needs no margin (any differing bit is the finding); beyond the rounding tolerance, the paged
    # output read other keys, not a rounding of the right ones.
    assert diagnosis is not None and diagnosis.max_abs > tolerance(case, v), diagnosis
