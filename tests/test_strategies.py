"""The strategies build only valid examples, reach every corner they promise, and keep compile-time values fixed;
every check that hands a subject a cache runs the ambiguous examples first; diff-KV examples have V's own head dim,
narrower and wider than K's, while examples of one head dim serialise as the stored regressions were written."""

import dataclasses
import json

import hypothesis
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from harness import checks
from harness.checks import transfer
from harness.contract import Contract, cross_layer, families, views
from harness.draws.cases import SPARSITY_MODES
from harness.draws.strategies import (
    AMBIGUOUS_KV_HEADS,
    CPU,
    GPU,
    Example,
    ambiguous,
    block_sizes,
    cases,
    examples,
    kv_lengths,
    num_blocks,
    oracle_cases,
    placements,
    sequence_mixes,
    within,
)
from harness.recordings import store
from harness.run import implementation
from harness.run.targets import Target

CONTRACTS = families() + [cross_layer(c, outer) for c in families()[:2] for outer in (True, False)]
DIFF_KV = [Contract.of(("B", "N", "H", "C"), ("B", "H", "N", "C"), diff_kv=True),
           Contract.of(("B", "H", "N", "C"), ("L", "B", "H", "N", "C"), cache_dtype="fp8_e4m3", diff_kv=True)]
SIZES = {"cpu": CPU, "gpu": GPU}
# The checks that hand a subject a cache: every suite whose check needs a split or a transfer.
CACHE_CHECKS = [c for c in checks.CHECKS if c.module and c.needs & {"split", "transfer"}]
FIND = settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])


class _Found(Exception):
    pass


def find(strategy, predicate, settings=FIND):
    """The first generated value satisfying `predicate` (no shrinking: reaching it is the point); fails if none."""
    hit = []

    @settings
    @given(strategy)
    def search(value):
        if predicate(value):
            hit.append(value)
            raise _Found

    try:
        search()
    except _Found:
        return hit[0]
    raise AssertionError(f"no value satisfying the predicate in {settings.max_examples} examples")


@settings(max_examples=150, database=None)
@given(ex=examples(CONTRACTS, CPU))
def test_examples_are_valid_and_round_trip(ex):
    assert Example.from_json(ex.to_json()) == ex
    assert ex.num_blocks >= ex.case.blocks_needed()
    pages = ex.paging()  # raises if the cache is too small
    assert pages.block_table.max() < ex.num_blocks
    kv_cache = views.allocate(ex.contract, ex.dims, ex.case.torch_dtype, "meta")
    views.validate(ex.contract, kv_cache, ex.dims)
    assert 1 <= ex.num_layers <= 8 and 0 <= ex.layer < ex.num_layers
    if not ex.contract.layout.shared:
        assert ex.num_layers == 1


@settings(max_examples=150, database=None)
@given(ex=examples(CONTRACTS, CPU))
def test_compile_time_values_come_from_the_fixed_sets(ex):
    c = ex.case
    assert c.head_dim in CPU.head_dims and c.block_size in CPU.block_sizes and c.dtype in CPU.dtypes
    assert c.kv_heads in CPU.kv_heads and c.num_heads // c.kv_heads in CPU.groups
    assert c.sparsity.mode in SPARSITY_MODES
    if c.sparsity.mode == "nm":
        assert c.sparsity.m in CPU.nm_groups
    assert max(c.kv_lens) <= CPU.long_len and len(c.kv_lens) <= CPU.max_seqs


def test_a_block_size_as_long_as_the_head_dim_comes_twice_as_often():
    assert find(block_sizes(CPU, 64), lambda b: b == 64, settings=FIND) == 64
    counts = {b: 0 for b in CPU.block_sizes}

    @settings(max_examples=600, database=None, derandomize=True, phases=[Phase.generate])
    @given(b=block_sizes(CPU, 64))
    def tally(b):
        counts[b] += 1

    tally()
    assert counts[64] > max(counts[16], counts[32]), counts


def test_page_boundary_lengths_are_reached():
    for bs in CPU.block_sizes:
        for edge in (1, bs - 1, bs, bs + 1, CPU.long_len):
            assert find(kv_lengths(bs, CPU.long_len), lambda n, e=edge: n == e, settings=FIND) == edge


def test_sequence_kinds_and_mixes_are_reached():
    mixes = sequence_mixes(16, CPU)
    find(mixes, lambda m: any(1 < q < kv for q, kv in zip(*m)), settings=FIND)  # chunked prefill
    find(mixes, lambda m: any(q == kv > 1 for q, kv in zip(*m)), settings=FIND)  # prefill
    find(mixes, lambda m: any(q == 1 < kv for q, kv in zip(*m)), settings=FIND)  # decode
    # one batch holding a prefill, a chunked prefill and a decode
    find(mixes, lambda m: {("p" if q == kv else "d" if q == 1 else "c") for q, kv in zip(*m)} == {"p", "c", "d"},
         settings=FIND)


def test_ambiguous_block_counts_and_spare_pages_are_reached():
    for n in (2, 3):
        assert find(num_blocks(1), lambda b, n=n: b == n, settings=FIND) == n
    find(num_blocks(5), lambda b: b > 5, settings=FIND)
    find(examples(CONTRACTS, CPU), lambda e: e.num_blocks == 2 and e.case.blocks_needed() == 2, settings=FIND)


def test_every_contract_page_order_and_layer_arrangement_is_reached():
    for c in CONTRACTS:
        find(examples([c], CPU), lambda e, c=c: e.contract == c, settings=FIND)
    for order in ("shuffled", "reversed", "sequential"):
        find(examples(CONTRACTS, CPU), lambda e, o=order: e.page_order == o, settings=FIND)
    # the last page of the cache holds tokens
    find(examples(CONTRACTS, CPU), lambda e: int(e.paging().block_table.max()) == e.num_blocks - 1 and
         e.num_blocks > e.case.blocks_needed(), settings=FIND)
    shared = [c for c in CONTRACTS if c.layout.shared]
    find(examples(shared, CPU), lambda e: e.num_layers == 8 and e.layer == 7, settings=FIND)


def test_gqa_mqa_sparsity_and_dtypes_are_reached():
    ex = examples(CONTRACTS, CPU)
    find(ex, lambda e: e.case.kv_heads == 1 and e.case.num_heads > 1, settings=FIND)  # MQA
    find(ex, lambda e: 1 < e.case.kv_heads < e.case.num_heads, settings=FIND)  # GQA
    for mode in SPARSITY_MODES:
        find(ex, lambda e, m=mode: e.case.sparsity.mode == m, settings=FIND)
    for dtype in CPU.dtypes:
        find(ex, lambda e, d=dtype: e.case.dtype == d, settings=FIND)
    find(ex, lambda e: not e.case.causal, settings=FIND)


@settings(max_examples=30, database=None)
@given(ex=examples(families(), GPU))
def test_gpu_sizes_are_realistic_but_valid(ex):
    assert ex.case.head_dim in GPU.head_dims and max(ex.case.kv_lens) <= GPU.long_len
    ex.paging()


def test_shrinks_to_the_plain_end():
    from hypothesis import find as shrink_to

    ex = shrink_to(examples(families(), CPU), lambda e: True, settings=settings(database=None))
    assert ex.case.q_lens == (1,) and ex.case.kv_lens == (1,) and ex.case.sparsity.mode == "none"
    assert ex.case.causal and ex.page_order == "shuffled"


def test_strategies_compose():
    # A suite can swap in its own case strategy and keep the geometry and paging builders.
    decode_only = st.builds(lambda e: e, examples(families(), CPU)).filter(lambda e: max(e.case.q_lens) == 1)
    assert max(find(decode_only, lambda e: len(e.case.q_lens) == 3, settings=FIND).case.q_lens) == 1


# ---- the shape-ambiguous sizes -------------------------------------------------------------------------------------


def _recorded_geometries():
    """Every recorded K/V contract of every release, once per release (a target of it)."""
    return [c for release in store.releases()
            for c in dict.fromkeys(c for c in store.load(release).contracts if not c.layout.latent)]


def test_the_checks_that_hand_a_subject_a_cache_declare_the_ambiguous_examples():
    assert {c.module for c in CACHE_CHECKS} == {"test_split", "test_malformed", "test_transfer", "test_relayout",
                                               "test_bit_identity", "test_determinism", "test_ulp_autotuned"}
    c = families()[1]
    for check in CACHE_CHECKS:
        got = [ex for ex, _ in implementation.of(check).explicit(Target(None, c), CPU)]  # a geometry's alone
        assert set(got) == set(ambiguous(c, CPU)), check.name


@pytest.mark.parametrize("device", sorted(SIZES))
def test_every_targets_explicit_examples_hold_the_coinciding_sizes(device):
    sizes = SIZES[device]
    geometries = _recorded_geometries()
    assert len(geometries) > 500 and any(c.diff_kv for c in geometries) and any(c.layout.shared for c in geometries)
    for c in geometries:
        built = ambiguous(c, sizes)
        assert sorted((ex.num_blocks, ex.case.blocks_needed()) for ex in built) == [(2, 2), (3, 1)], c.name
        for ex in built:
            assert ex.case.kv_heads == AMBIGUOUS_KV_HEADS and ex.case.block_size == ex.case.head_dim, (c.name, ex)
            assert (ex.num_layers, ex.layer) == ((2, 1) if c.layout.shared else (1, 0)), c.name
            assert (ex.head_dim_v not in (0, ex.case.head_dim)) == c.diff_kv, (c.name, ex.head_dim_v)
            assert ex.case.head_dim in sizes.block_sizes
            views.validate(c, views.allocate(c, ex.dims, ex.case.torch_dtype, "meta"), ex.dims)
            assert int(ex.paging().block_table.max()) == ex.num_blocks - 1  # the last page holds tokens
        if c.diff_kv:  # V narrower than K in one, wider in the other
            assert sorted(ex.head_dim_v > ex.case.head_dim for ex in built) == [False, True], (c.name, built)
        for check in CACHE_CHECKS:
            pairs = implementation.of(check).explicit(Target(None, c), sizes)
            extras = {extra for _, extra in pairs}
            assert [ex for ex, _ in pairs] == built
            assert extras == ({0} if check.needs == {"transfer"} else {None}), check.name


def test_sizes_without_a_coinciding_head_dim_and_block_size_are_refused():
    with pytest.raises(ValueError, match=r"no head dim \(80,\) is also a block size \(16, 32\)"):
        dataclasses.replace(CPU, head_dims=(80,), block_sizes=(16, 32))
    with pytest.raises(ValueError, match=r"kv_heads \(1, 4\) lack 2"):
        dataclasses.replace(CPU, kv_heads=(1, 4))
    with pytest.raises(ValueError, match="equal: \\[\\(64, 64\\)\\]"):
        dataclasses.replace(CPU, diff_kv_dims=((64, 64),))
    with pytest.raises(ValueError, match=r"hold K's head dim 64 .* with a narrower and a wider V \(has \[\]\)"):
        dataclasses.replace(CPU, diff_kv_dims=((80, 48),))
    for one_side in (((64, 32), (80, 96)), ((64, 96), (64, 128))):  # K 64's V only narrower, only wider
        with pytest.raises(ValueError, match="with a narrower and a wider V"):
            dataclasses.replace(CPU, diff_kv_dims=one_side)
    assert (CPU.coinciding, GPU.coinciding) == (64, 128)


def test_generated_examples_reach_every_coincidence_at_once():
    # Rarer than one corner at a time (measured: about 1 in 800 draws on the GPU sizes, 1 in 400 on the CPU ones): a
    # fixed seed and a larger budget.
    fixed = settings(FIND, max_examples=5000, derandomize=True)
    shared = [c for c in CONTRACTS if c.layout.shared]
    for sizes in (CPU, GPU):
        find(examples(shared, sizes), lambda e: e.case.kv_heads == 2 and e.case.block_size == e.case.head_dim
             and e.num_blocks == 2 and e.num_layers == 2, settings=fixed)
    find(examples(shared, CPU), lambda e: e.case.kv_heads == 2 and e.case.block_size == e.case.head_dim
         and e.num_blocks == e.case.blocks_needed() == 2, settings=fixed)  # both pages hold tokens
    find(examples(DIFF_KV, CPU), lambda e: e.case.block_size == e.case.head_dim and e.num_blocks == 2
         and e.case.kv_heads == 2, settings=fixed)
    # transfer's own strategy too
    find(transfer.examples(shared, CPU), lambda e: e.case.kv_heads == 2 and e.case.block_size == e.case.head_dim
         and e.num_blocks == 2 and e.num_layers == 2, settings=fixed)


# ---- diff-KV examples: V's own head dim ---------------------------------------------------------------------------


@settings(max_examples=100, database=None)
@given(ex=st.one_of(examples(DIFF_KV, CPU), transfer.examples(DIFF_KV, CPU)))
def test_diff_kv_examples_draw_vs_head_dim_unlike_ks_and_round_trip(ex):
    assert (ex.case.head_dim, ex.head_dim_v) in CPU.diff_kv_dims and ex.head_dim_v != ex.case.head_dim
    assert ex.dims.v_dim == ex.head_dim_v and ex.dims.head_dim == ex.case.head_dim
    assert json.loads(ex.to_json())["head_dim_v"] == ex.head_dim_v
    back = Example.from_json(ex.to_json())
    assert back == ex and back.digest() == ex.digest()
    kv_cache = views.allocate(ex.contract, ex.dims, ex.case.torch_dtype, "meta")
    views.validate(ex.contract, kv_cache, ex.dims)
    _, k, v = ex.inputs()
    assert k.shape[-1] == ex.case.head_dim and v.shape[-1] == ex.head_dim_v and k.shape[:-1] == v.shape[:-1]


@settings(max_examples=50, database=None)
@given(ex=examples(DIFF_KV, GPU))
def test_gpu_diff_kv_examples_take_the_gpu_pairs(ex):
    assert (ex.case.head_dim, ex.head_dim_v) in GPU.diff_kv_dims


@pytest.mark.parametrize("device", sorted(SIZES))
def test_diff_kv_draws_reach_v_narrower_and_wider_than_k(device):
    # A consumer reading V at K's width (C[..., Dk:2*Dk]) is right wherever V is narrower: C's end cuts it to V.
    sizes = SIZES[device]
    for strategy in (examples(DIFF_KV, sizes), transfer.examples(DIFF_KV, sizes)):
        find(strategy, lambda e: e.head_dim_v < e.case.head_dim, settings=FIND)
        find(strategy, lambda e: e.head_dim_v > e.case.head_dim, settings=FIND)
    narrow, wide = (ex.head_dim_v for ex in ambiguous(DIFF_KV[0], sizes))
    assert narrow < sizes.coinciding < wide, (narrow, wide)


@settings(max_examples=50, database=None)
@given(ex=examples(CONTRACTS, CPU))
def test_examples_of_one_head_dim_say_nothing_of_v_and_draw_equal_k_and_v(ex):
    assert ex.head_dim_v == 0 and "head_dim_v" not in json.loads(ex.to_json())
    _, k, v = ex.inputs()
    assert k.shape == v.shape and torch.equal(v, ex.case.inputs()[2])


def test_the_v_head_dim_is_part_of_a_diff_kv_examples_identity():
    ex = ambiguous(DIFF_KV[0], CPU)[0]
    same_dims = dataclasses.replace(ex, head_dim_v=0)
    assert ex.digest() != same_dims.digest() and Example.from_json(same_dims.to_json()).head_dim_v == 0


def test_a_v_head_dim_on_a_contract_of_one_head_dim_is_refused_by_name():
    ex = ambiguous(families()[0], CPU)[0]
    with pytest.raises(ValueError, match=r"V head dim 32 != K head dim 64 .*\(not diff-KV\)"):
        dataclasses.replace(ex, head_dim_v=32)


def test_every_stored_regression_replays_with_its_digest_and_case():
    # A REPRO line's `-k <digest>` names the stored file: the example read back must have that digest.
    stored = sorted((store.ROOT.parent / "regressions").glob("*/*.json"))
    assert len(stored) > 20 and any(json.loads(p.read_text())["example"]["contract"].get("diff_kv") for p in stored)
    for path in stored:
        body = json.loads(path.read_text())
        ex = Example.from_json(json.dumps(body["example"]))
        assert ex.digest() == path.stem.split("-")[-1] and repr(ex.case) == body["case"], path.name
        assert json.loads(ex.to_json()) == body["example"], path.name


def test_an_example_holds_its_own_targets_contract_after_an_equal_one_of_another_release():
    # Builders are cached per argument set; contracts of two releases compare equal (the origin is not compared), so
    # a cached sampled_from of contracts would hand one release's examples the other's contract (and digest).
    first = dataclasses.replace(families()[0], origin=dataclasses.replace(families()[0].origin, release="0.9.2"))
    second = dataclasses.replace(first, origin=dataclasses.replace(first.origin, release="0.33.0"))
    assert first == second and first.origin != second.origin
    for contract in (first, second):
        seen = []
        given(ex=examples([contract], CPU))(settings(max_examples=3, database=None)(
            lambda ex: seen.append(ex.contract.origin)))()
        assert seen and all(o == contract.origin for o in seen)


@pytest.mark.parametrize("wrong", [
    lambda ex: ex.num_blocks == 2,  # a consumer that takes an axis of 2 for K/V
    lambda ex: ex.case.kv_heads == 2 and ex.case.block_size == ex.case.head_dim,
    lambda ex: ex.num_blocks > 3 and ex.case.dtype == "bfloat16",
])
def test_placements_shrink_to_what_the_views_see_of_the_example_that_examples_shrinks_to(wrong):
    """The cache and layer (dims, dtype) are the same; the batch is not (examples' minimal batch is what it takes to
    need that many pages, the views' is one token)."""
    c = next(c for c in store.load("0.22.1").contracts if not c.layout.shared and not c.layout.latent)
    found = [hypothesis.find(s, wrong, settings=settings(database=None, max_examples=2000, derandomize=True))
             for s in (examples([c], CPU), placements([c], CPU))]
    assert [(ex.contract, ex.dims, ex.case.dtype) for ex in found] == [(found[0].contract, found[0].dims,
                                                                          found[0].case.dtype)] * 2, found


def test_placements_reach_every_page_count_and_size_examples_reaches():
    c = next(c for c in store.load("0.29.0").contracts if c.layout.shared and not c.layout.latent)
    seen: dict[str, set] = {"old": set(), "new": set()}
    for name, s in (("old", examples([c], CPU)), ("new", placements([c], CPU))):
        @hypothesis.seed(1)
        @settings(max_examples=3000, database=None, suppress_health_check=list(HealthCheck))
        @given(s)
        def draw(ex):
            seen[name].add((ex.num_blocks, ex.case.head_dim, ex.case.block_size, ex.case.kv_heads, ex.case.dtype,
                            ex.num_layers, ex.layer))
        draw()
    for i, what in enumerate(("num_blocks", "head_dim", "block_size", "kv_heads", "dtype", "layers", "layer")):
        assert {v[i] for v in seen["old"]} <= {v[i] for v in seen["new"]}, what


@settings(max_examples=60, database=None)
@given(case=st.sampled_from(SPARSITY_MODES).flatmap(lambda mode: oracle_cases(GPU, mode)))
def test_the_oracles_gpu_cases_stay_within_its_work(case):
    assert sum(q * kv for q, kv in zip(case.q_lens, case.kv_lens)) * case.num_heads <= GPU.oracle_work


def test_the_oracles_bound_never_binds_on_the_cpu():
    """So the CPU's oracle draws what `cases` draws, example for example."""
    assert CPU.max_seqs * CPU.long_len**2 * max(CPU.kv_heads) * max(CPU.groups) <= CPU.oracle_work
    for mode in SPARSITY_MODES:
        drawn = []
        for s in (cases(CPU, mode), oracle_cases(CPU, mode)):
            drawn.append([])

            @settings(max_examples=100, database=None, derandomize=True)
            @given(s)
            def draw(case):
                drawn[-1].append(case)
            draw()
        assert drawn[0] == drawn[1], mode


@pytest.mark.parametrize("q_lens, kv_lens, heads, work, want", [
    ((8192,), (8192,), 2, 2**27, ((8192,), (8192,))),  # fits exactly
    ((8192,), (8192,), 64, 2**27, ((1448,), (1448,))),  # a prefill stays one, shorter
    ((100, 8192), (8192, 8192), 64, 2**27, ((100,), (8192,))),  # the prefill that does not fit is left out
    ((8000, 1), (8192, 5000), 64, 2**27, ((1,), (5000,))),  # a later sequence kept where an earlier did not fit
    ((4000,), (8192,), 64, 2**27, ((256,), (8192,))),  # a chunked prefill keeps its keys, fewer queries
    ((4000,), (8192,), 64, 2**18, ((1,), (8192,))),  # ... a decode at the least
])
def test_within_keeps_what_fits_and_shortens_only_a_first_sequence_alone(q_lens, kv_lens, heads, work, want):
    assert within(q_lens, kv_lens, heads, work) == want
