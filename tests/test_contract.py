"""The contract model: every family/order/layer arrangement round-trips, lands where its physical order says,
and malformed caches are rejected with an error naming the full shape and the expected contract."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compare import diagnose
from harness.contract import Contract, ContractError, Dims, cross_layer, families, views
from harness.handed.cache import paging, read, write

SINGLE = families()
SHARED = [cross_layer(c, outer) for c in SINGLE for outer in (True, False)]
GENERIC_PACKED = [Contract.of(("B", "H", "N", "C"), p + ("C",)) for p in itertools.permutations("LBHN")]
ALL = list(dict.fromkeys(SINGLE + SHARED + GENERIC_PACKED))  # the generic packed set repeats two cross-layer ones
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@st.composite
def dims_for(draw, contract: Contract) -> Dims:
    layers = draw(st.integers(1, 8)) if contract.layout.shared else 1
    return Dims(
        num_blocks=draw(st.integers(1, 6)),
        block_size=16 * draw(st.integers(1, 4)),
        kv_heads=draw(st.integers(1, 4)),
        head_dim=8 * draw(st.integers(1, 6)),
        num_layers=layers,
        layer=draw(st.integers(0, layers - 1)),
    )


@st.composite
def filled_cache(draw):
    """A contract, dims, dtype, a paging over part of the cache and the tokens written through it."""
    contract = draw(st.sampled_from(ALL))
    dims = draw(dims_for(contract))
    dtype = draw(st.sampled_from(DTYPES))
    capacity = dims.num_blocks * dims.block_size
    kv_lens = tuple(draw(st.lists(st.integers(1, capacity), min_size=1, max_size=3)))
    if sum(-(-n // dims.block_size) for n in kv_lens) > dims.num_blocks:
        kv_lens = (draw(st.integers(1, capacity)),)
    pages = paging(kv_lens, dims.block_size, dims.num_blocks, draw(st.sampled_from(["shuffled", "reversed"])),
                   draw(st.integers(0, 2**16)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    shape = (sum(kv_lens), dims.kv_heads, dims.head_dim)
    k, v = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    return contract, dims, pages, k, v


def physical_buffer(kv_cache: torch.Tensor, contract: Contract, dims: Dims) -> torch.Tensor:
    """The whole allocation behind a layer's kv_cache, in memory order (independent of `split`)."""
    shape = views.physical_shape(contract, dims)
    return torch.as_strided(kv_cache, shape, _contiguous_strides(shape), 0)


def _contiguous_strides(shape):
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def expected_location(contract: Contract, dims: Dims, kv: int, page: int, offset: int, head: int, dim: int):
    """Index into the physical buffer of one K (kv=0) or V (kv=1) element, from the contract's axis names alone."""
    at = {"L": dims.layer, "B": page, "N": offset, "H": head}
    if contract.layout.packed:
        at["C"] = kv * dims.head_dim + dim
    else:
        at.update(KV=kv, D=dim)
    return tuple(at[a] for a in contract.layout.physical)


@settings(max_examples=150, deadline=None)
@given(filled_cache())
def test_round_trip_is_bit_exact_and_lands_where_the_physical_order_says(data):
    contract, dims, pages, k, v = data
    kv_cache = views.allocate(contract, dims, k.dtype)
    kc, vc = views.split(contract, kv_cache, dims)
    assert kc.shape == vc.shape == (dims.num_blocks, dims.block_size, dims.kv_heads, dims.head_dim)
    write(kc, vc, pages, k, v)

    k_back, v_back = read(*views.split(contract, kv_cache, dims), pages)
    assert diagnose(k_back, k) is None and diagnose(v_back, v) is None

    buf = physical_buffer(kv_cache, contract, dims)
    written = torch.zeros(buf.shape, dtype=torch.bool)
    rng = np.random.default_rng(0)
    for token in rng.choice(len(pages.slot_mapping), size=min(8, len(pages.slot_mapping)), replace=False):
        slot = int(pages.slot_mapping[token])
        page, offset = divmod(slot, dims.block_size)
        head, dim = int(rng.integers(dims.kv_heads)), int(rng.integers(dims.head_dim))
        for kv, src in ((0, k), (1, v)):
            loc = expected_location(contract, dims, kv, page, offset, head, dim)
            assert buf[loc].view(torch.int16 if k.element_size() == 2 else torch.int32) == \
                src[token, head, dim].view(torch.int16 if k.element_size() == 2 else torch.int32)
    for token, slot in enumerate(pages.slot_mapping.tolist()):
        page, offset = divmod(slot, dims.block_size)
        for kv in (0, 1):
            idx = list(expected_location(contract, dims, kv, page, offset, 0, 0))
            last = contract.layout.physical[-1]
            h_axis = contract.layout.physical.index("H")
            idx[h_axis] = slice(None)
            idx[-1] = slice(kv * dims.head_dim, (kv + 1) * dims.head_dim) if last == "C" else slice(None)
            written[tuple(idx)] = True
    assert buf[~written].isnan().all(), "a write spilled outside its slots, or poison is missing"


@pytest.mark.parametrize("contract", ALL, ids=lambda c: c.name)
def test_split_views_alias_the_cache(contract):
    dims = Dims(3, 16, 2, 8, num_layers=2 if contract.layout.shared else 1, layer=1 if contract.layout.shared else 0)
    kv_cache = views.allocate(contract, dims, torch.float32)
    k, v = views.split(contract, kv_cache, dims)
    k.fill_(1.0)
    v.fill_(2.0)
    assert kv_cache.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
    assert (kv_cache == 1.0).sum() + (kv_cache == 2.0).sum() == kv_cache.numel()


def test_geometry_distinguishes_every_contract():
    dims = Dims(3, 16, 4, 8, num_layers=2, layer=1)
    seen = {}
    for c in ALL:
        geo = views.geometry(c, dims)
        assert geo not in seen, f"{c.name} and {seen.get(geo)} have the same geometry"
        seen[geo] = c.name


def test_families_cover_both_orders_of_each_layout():
    assert sorted((c.layout.family, c.layout.order) for c in SINGLE) == sorted(
        itertools.product(["kv-first", "blocks-first", "packed"], ["NHD", "HND"])
    )


# --- rejections: each error names the full shape, the strides and the expected contract ---

KV_FIRST, BLOCKS_FIRST, PACKED = SINGLE[0], SINGLE[2], SINGLE[5]
DIMS = Dims(num_blocks=3, block_size=16, kv_heads=4, head_dim=8)


def assert_rejected(contract, tensor, reason, dims=None):
    with pytest.raises(ContractError) as err:
        views.split(contract, tensor, dims)
    msg = str(err.value)
    assert reason in msg
    assert str(tuple(tensor.shape)) in msg and str(tuple(tensor.stride())) in msg
    assert contract.describe() in msg


def test_rejects_wrong_rank():
    assert_rejected(BLOCKS_FIRST, torch.zeros(3, 2, 16, 32), "rank 4, expected 5")


def test_rejects_wrong_sizes_against_dims():
    assert_rejected(KV_FIRST, torch.zeros(2, 3, 16, 4, 16), "axis D has size 16, expected 8", DIMS)


def test_rejects_kv_axis_not_two():
    # (3, 2, ...) read as kv-first: the ambiguity a shape[0]==2 check falls for when num_blocks == 2 is the other way
    assert_rejected(KV_FIRST, torch.zeros(3, 2, 16, 4, 8), "K/V axis has size 3, expected 2")


def test_rejects_odd_packed_axis():
    assert_rejected(PACKED, torch.zeros(3, 4, 16, 15), "packed axis C has odd size 15")


def test_rejects_packed_axis_not_twice_head_dim():
    assert_rejected(PACKED, torch.zeros(3, 4, 16, 32), "expected 16 (K's width 8 + V's width 8)", DIMS)


def test_rejects_non_unit_innermost_stride():
    t = torch.zeros(3, 2, 16, 4, 16)[..., ::2]
    assert_rejected(BLOCKS_FIRST, t, "innermost axis D has stride 2, expected 1")


def test_rejects_a_cache_whose_memory_order_is_not_the_contracts():
    hnd = SINGLE[3]
    assert hnd.layout.order == "HND"
    contiguous = torch.zeros(3, 2, 16, 4, 8)
    assert_rejected(hnd, contiguous, "axis H has stride 8 but the axes inside it in memory [N,D] span 512")


def test_rejects_strides_of_another_allocation_when_dims_are_known():
    shared = cross_layer(BLOCKS_FIRST, layers_outermost=False)
    layer_view = views.allocate(shared, Dims(3, 16, 4, 8, num_layers=2), torch.float16)
    assert_rejected(BLOCKS_FIRST, layer_view, "axis B has stride 2048, expected 1024", DIMS)


@pytest.mark.parametrize(
    "logical, physical, reason",
    [
        (("B", "N", "KV", "H", "D"), ("B", "N", "KV", "H", "D"), "unknown logical layout [B,N,KV,H,D]"),
        (("B", "KV", "N", "H", "D"), ("B", "KV", "N", "H"), "is not a permutation"),
        (("B", "KV", "N", "H", "D"), ("B", "KV", "N", "H", "D", "X"), "is not a permutation"),
        (("B", "H", "N", "C"), ("B", "H", "C", "N"), "must keep C innermost"),
    ],
)
def test_unknown_or_inconsistent_contracts_are_rejected(logical, physical, reason):
    with pytest.raises(ContractError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        Contract.of(logical, physical, origin="vllm 9.9.9 TEST")


def test_error_names_the_release():
    c = Contract.of(BLOCKS_FIRST.layout.logical, BLOCKS_FIRST.layout.physical, origin="vllm 0.33.0 FLASH_ATTN NHD")
    with pytest.raises(ContractError, match="from vllm 0.33.0 FLASH_ATTN NHD"):
        views.split(c, torch.zeros(3, 3, 16, 4, 8))


def test_integer_caches_cannot_be_poisoned():
    with pytest.raises(ContractError, match="cannot poison"):
        views.allocate(KV_FIRST, DIMS, torch.int8)


# --- the round-trip check can fail: deliberately wrong splits are caught ---

def unbind_wrong_axis(contract, kv_cache):
    return kv_cache.unbind(1 if contract.layout.logical[0] == "KV" else 0)[:2] if not contract.layout.packed else (
        kv_cache[:, 0].unsqueeze(1), kv_cache[:, 1].unsqueeze(1))


def swapped_halves(contract, kv_cache):
    k, v = views.split(contract, kv_cache)
    return v, k


def physical_order_ignored(contract, kv_cache):
    # Reads the storage as if it were laid out contiguously in logical order.
    flat = torch.as_strided(kv_cache, kv_cache.shape, _contiguous_strides(kv_cache.shape), kv_cache.storage_offset())
    return views.split(contract, flat)


def split_of_a_copy(contract, kv_cache):
    return views.split(contract, kv_cache.contiguous())


def packed_halves_on_wrong_axis(contract, kv_cache):
    t = kv_cache.transpose(1, 2)  # (B, N, H, C) -> correct; then split heads instead of C
    h = t.shape[2] // 2
    return t[:, :, :h], t[:, :, h:]


WRONG_SPLITS = {
    "unbind-wrong-axis": unbind_wrong_axis,
    "kv-swapped": swapped_halves,
    "physical-order-ignored": physical_order_ignored,
    "split-of-contiguous-copy": split_of_a_copy,
    "packed-halves-on-heads": packed_halves_on_wrong_axis,
}


def round_trip_failure(contract, dims, wrong_split):
    """Write through the wrong split, read through the contract's: the round-trip check must object."""
    pages = paging((dims.num_blocks * dims.block_size - 3,), dims.block_size, dims.num_blocks, seed=3)
    shape = (len(pages.slot_mapping), dims.kv_heads, dims.head_dim)
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    kv_cache = views.allocate(contract, dims, torch.float32)
    try:
        wk, wv = wrong_split(contract, kv_cache)
        write(wk, wv, pages, k, v)
    except (RuntimeError, IndexError, ContractError) as e:  # a crash is a caught failure too
        return f"crashed: {e}"
    k_back, v_back = read(*views.split(contract, kv_cache, dims), pages)
    return diagnose(k_back, k) or diagnose(v_back, v)


def _wrong_split_cases():
    # Ignoring the memory order, or splitting a contiguous copy, is only wrong where the layer's kv_cache is not
    # already contiguous; packed-halves-on-heads only applies to packed caches.
    for contract in ALL:
        dims = Dims(3, 16, 2, 8, num_layers=2 if contract.layout.shared else 1)
        contiguous = views.allocate(contract, dims, torch.float32, device="meta").is_contiguous()
        for name in WRONG_SPLITS:
            if contiguous and name in ("physical-order-ignored", "split-of-contiguous-copy"):
                continue
            if name == "packed-halves-on-heads" and not contract.layout.packed:
                continue
            yield pytest.param(contract, dims, name, id=f"{contract.name}-{name}")


@pytest.mark.parametrize("contract, dims, name", list(_wrong_split_cases()))
def test_round_trip_catches_a_wrong_split(contract, dims, name):
    assert round_trip_failure(contract, dims, WRONG_SPLITS[name]) is not None


def test_round_trip_passes_for_the_right_split():
    for contract in ALL:
        dims = Dims(3, 16, 2, 8, num_layers=2 if contract.layout.shared else 1)
        assert round_trip_failure(contract, dims, lambda c, t: views.split(c, t)) is None


def test_a_recorded_origin_is_read_into_release_backend_and_setting():
    from harness.backends import BACKENDS as PROBED
    from harness.contract import Origin
    from harness.recordings import store

    BACKENDS = {b.name for b in PROBED}

    o = Origin.parse("vllm 0.33.0 FLASH_ATTN LBNHC single-layer + BLNHC single-layer")
    assert (o.release, o.backend, o.setting) == ("0.33.0", "FLASH_ATTN", "LBNHC single-layer + BLNHC single-layer")
    assert Origin.parse("hand-made") == Origin(setting="hand-made") and str(Origin()) == ""
    for release in store.releases():  # every recorded line reads back into the same line, naming its release
        for c in store.load(release).contracts:
            assert c.origin.backend_name in BACKENDS and str(Origin.parse(str(c.origin))) == str(c.origin)
            assert c.origin.release == release or release == "main"
