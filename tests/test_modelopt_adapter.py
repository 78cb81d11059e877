"""The modelopt subject's adapter on the CPU, against the installed nvidia-modelopt (no CUDA, no vLLM).

Release -> plugin split -> canonical views: for every contract family, physical order and cross-layer arrangement,
replaying a release the way its probe recorded it, the vLLM plugin's own forward is run and the K/V views it hands
its kernel are compared with the contract's (memory, shape, strides, and the values written through them).
A release without FlashAttentionBackend.get_kv_cache_shape is a contract-error carrying the plugin's own text; a
deliberately broken plugin split is caught. modelopt's Triton kernel runs under TRITON_INTERPRET=1 at tiny shapes
(its `torch.cuda.device(q.device)` launch context is made a no-op for CPU tensors; see the subject's module).

modelopt's autotuner cannot time its candidates in the interpreter, so here the subject declares no `autotune` and
the ulp-autotuned check is not applicable to it; on CUDA it runs in the suites (`pytest conformance
--kvconform-subject modelopt -k ulp_autotuned`) over all of `_FWD_CONFIGS`, which under pytest modelopt itself
trims to its first.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first triton import (modelopt's kernels are jitted on import)

import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from unittest import mock  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from harness.compare import (  # noqa: E402
    assert_bit_identical,
    diagnose,
    reference,  # noqa: E402
)
from harness.contract import Contract, ContractError, Dims, families, views  # noqa: E402
from harness.draws.cases import Case, Sparsity  # noqa: E402
from harness.handed.cache import paging, write  # noqa: E402
from harness.handed.layer import in_force, layer_for  # noqa: E402
from harness.recordings import store
from harness.recordings.store import Recording  # noqa: E402
from harness.subjects import SparsitySemantics, TileConfig, capabilities_of, semantics_of  # noqa: E402
from harness.vllm_api import backend_class  # noqa: E402
from kvconform.subjects.modelopt import (  # noqa: E402
    ModeloptSubject,
    ModeloptUnavailable,
    VllmRelease,
    split_mismatch,
)

try:  # through the subject, so that KVCONFORM_MODELOPT (a version or a source tree) selects what is tested
    VERSION = ModeloptSubject().version
except ModeloptUnavailable as unavailable:
    pytest.skip(str(unavailable), allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
from harness.checks import oracle as oracle_check  # noqa: E402

# The recorded releases on either side of FlashAttentionBackend.get_kv_cache_shape's removal, replayed through
# harness.vllm_api's stand-ins (the newest release of the shape era, the first of the KVCacheLayout era).
_with_api = [r for r in store.releases() if store.load(r).api is not None]
_shape = [r for r in _with_api if "get_kv_cache_shape" in VllmRelease.from_recording(store.load(r)).backend_methods]
_enum = [r for r in _with_api if r not in _shape and r != "main"]
if not _shape or not _enum:
    pytest.skip(f"the recordings with the layout API ({_with_api}) span no shape-era and enum-era release",
                allow_module_level=True)
SHAPE_ERA = VllmRelease.from_recording(store.load(_shape[-1]))  # get_kv_cache_shape + stride order
ENUM_ERA = VllmRelease.from_recording(store.load(_enum[0]))  # KVCacheLayout, no shape method


def _release_for(contract: Contract) -> VllmRelease:
    """The newest recorded shape-era release whose FlashAttentionBackend answers `contract`'s family: its stand-in
    answers that release's own shape, so a contract of another family would be (rightly) mis-split."""
    for r in reversed(_shape):
        rec = store.load(r)
        if any(c.layout.logical == contract.layout.logical for c in rec.contracts
               if c.origin.backend_name == "FLASH_ATTN"):
            return VllmRelease.from_recording(rec)
    pytest.skip(f"no recording with the layout API has FLASH_ATTN's {contract.layout.family} family "
                f"(recorded: {_shape})")
FAMILY = {"kv-first": "0.22.1", "blocks-first": "0.25.1", "packed": _shape[-1]}  # a shape-era release per family
# Every geometry those releases hand FlashAttention (the plugin's backend): both stride orders, cross-layer too.
CONTRACTS = [c for r in FAMILY.values() for c in dict.fromkeys(
    c for c in store.load(r).contracts if c.origin.backend_name == "FLASH_ATTN" and c.cache_dtype == "auto")]
ENUM_CONTRACTS = [c for c in dict.fromkeys(ENUM_ERA.recording.contracts)
                  if c.origin.backend_name == "FLASH_ATTN" and c.cache_dtype == "auto"]


def _family(name: str) -> Contract:
    return next(c for c in CONTRACTS if c.layout.family == name and not c.layout.shared)


def _layer(contract: Contract, dims: Dims, release: VllmRelease | None = None):
    """The layer `release` (default: the one of `contract`'s family) hands FlashAttention for a cache of
    `contract`, under the setting the recording read that geometry under."""
    release = release or _release_for(contract)
    recorded = next((c for c in release.recording.contracts if c == contract), contract)
    return layer_for(recorded, dims, torch.float16, backend_class(release.recording, "FLASH_ATTN"), release.version,
                     release.recording)


def _split(subject: ModeloptSubject, kv: torch.Tensor, contract: Contract, dims: Dims,
           release: VllmRelease | None = None):
    """The plugin's split as the runner calls it: handed the layer, with its release in force."""
    layer = _layer(contract, dims, release or subject.release)
    with in_force(layer):
        return subject.split(kv, layer)


def _dims(contract: Contract, num_blocks: int) -> Dims:
    return Dims(num_blocks, 16, 2, 32, num_layers=3, layer=1) if contract.layout.shared else Dims(num_blocks, 16, 2, 32)


def _filled(contract: Contract, dims: Dims) -> torch.Tensor:
    """A kv_cache whose every element holds a distinct value, so any wrong view reads different numbers."""
    kv = views.allocate(contract, dims, torch.float32)
    kv.copy_(torch.arange(kv.numel(), dtype=torch.float32).reshape(kv.shape))
    return kv


@pytest.mark.parametrize("num_blocks", [2, 3, 5])  # 2 = the K/V axis size, 3 = the plugin's own probe size
@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name)
def test_plugin_split_agrees_with_the_contract(contract: Contract, num_blocks: int) -> None:
    dims = _dims(contract, num_blocks)
    kv = _filled(contract, dims)
    got = _split(ModeloptSubject(_release_for(contract)), kv, contract, dims)
    want = views.split(contract, kv, dims)
    assert split_mismatch(got, want) is None
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("contract", ENUM_CONTRACTS, ids=lambda c: c.name)
def test_release_without_get_kv_cache_shape_is_a_contract_error(contract: Contract) -> None:
    dims = _dims(contract, 3)
    kv = views.allocate(contract, dims, torch.float16)
    with pytest.raises(ContractError) as err:
        _split(ModeloptSubject(ENUM_ERA), kv, contract, dims)
    text = str(err.value)
    # The plugin's own exception, the release replayed, the full shape and the layer.
    assert "AttributeError: type object 'FlashAttentionBackend' has no attribute 'get_kv_cache_shape'" in text
    assert f"REPLAY of vLLM {ENUM_ERA.version}" in text and str(tuple(kv.shape)) in text
    assert _layer(contract, dims, ENUM_ERA).describe() in text


def test_the_plugin_rejects_a_layout_it_does_not_know() -> None:
    # A release whose shape method answers none of the three families the plugin knows: its RuntimeError, kept.
    contract = _family("kv-first")
    kv = views.allocate(contract, _dims(contract, 3), torch.float16)
    # A class that is no stand-in is left in place by the replay's rebinding.
    import modelopt.torch.sparsity.attention_sparsity.plugins.vllm as plugin

    odd = type("FlashAttentionBackend", (), {"get_kv_cache_shape": staticmethod(lambda *a, **k: (3, 16, 2, 1, 16))})
    subject = ModeloptSubject(_release_for(contract))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plugin, "FlashAttentionBackend", odd)
        with pytest.raises(ContractError, match=r"RuntimeError: Unsupported vLLM FlashAttention KV cache shape "
                                                r"\(3, 16, 2, 1, 16\)"):
            _split(subject, kv, contract, _dims(contract, 3))


@pytest.mark.parametrize("release", _with_api)
def test_an_unbound_subject_replays_the_layers_release(release: str) -> None:
    rec = store.load(release)
    expected = VllmRelease.from_recording(rec)
    served = [c for c in rec.contracts if c.origin.backend_name == "FLASH_ATTN" and c.cache_dtype == "auto"]
    assert served
    for contract in served:
        dims = _dims(contract, 3)
        kv = views.allocate(contract, dims, torch.float16)
        if "get_kv_cache_shape" not in expected.backend_methods:
            with pytest.raises(ContractError, match=f"REPLAY of vLLM {release}.*no attribute 'get_kv_cache_shape'"):
                _split(ModeloptSubject(), kv, contract, dims, expected)
        else:
            assert split_mismatch(_split(ModeloptSubject(), kv, contract, dims, expected),
                                  views.split(contract, kv, dims)) is None


def test_replay_needs_a_well_formed_cache() -> None:
    contract = _family("blocks-first")
    dims = _dims(contract, 3)
    kv = views.allocate(contract, dims, torch.float16)
    with pytest.raises(ContractError, match=r"rank 4, expected 5.*shape \(3, 16, 2, 32\)"):
        _split(ModeloptSubject(_release_for(contract)), kv[:, 0], contract, dims)


WRONG_FAMILY = [(c, wrong) for c in CONTRACTS if not c.layout.shared for wrong in ("kv-first", "blocks-first", "packed")
                if wrong != c.layout.family]


@pytest.mark.parametrize(("contract", "wrong"), WRONG_FAMILY, ids=lambda x: getattr(x, "name", x))
def test_a_broken_plugin_split_is_caught(contract: Contract, wrong: str) -> None:
    # The plugin's detection forced to a wrong family. With num_blocks == 2 a wrong unbind still yields two views
    # of plausible rank (the silent case); the check must see it through memory, shape or strides.
    import modelopt.torch.sparsity.attention_sparsity.plugins.vllm as plugin

    dims = _dims(contract, 2)
    kv = _filled(contract, dims)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plugin, "_flash_attention_kv_cache_layout", lambda: wrong)
        try:
            got = _split(ModeloptSubject(_release_for(contract)), kv, contract, dims)
        except ContractError as err:
            assert str(tuple(kv.shape)) in str(err)  # refused, and said so: a contract-error
            return
    assert split_mismatch(got, views.split(contract, kv, dims)) is not None


def test_a_wrong_unbind_can_be_silent() -> None:
    # kv-first read as blocks-first at num_blocks == 2: no exception, two [2, N, H, D] views, wrong memory.
    import modelopt.torch.sparsity.attention_sparsity.plugins.vllm as plugin

    contract = _family("kv-first")
    dims = _dims(contract, 2)
    kv = _filled(contract, dims)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plugin, "_flash_attention_kv_cache_layout", lambda: "blocks-first")
        got = _split(ModeloptSubject(_release_for(contract)), kv, contract, dims)
    want = views.split(contract, kv, dims)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert "V: plugin view" in split_mismatch(got, want) or "K: plugin view" in split_mismatch(got, want)


def test_swapped_k_and_v_are_caught() -> None:
    contract = _family("packed")
    kv = _filled(contract, _dims(contract, 3))
    k, v = _split(ModeloptSubject(_release_for(contract)), kv, contract, _dims(contract, 3))
    assert split_mismatch((v, k), views.split(contract, kv)) is not None


def test_the_stand_in_answers_the_release_not_the_contract() -> None:
    # A contract of another family than the replayed release's: the plugin asks the release and mis-splits (or
    # refuses); a stand-in answering from the contract under test would hide this.
    release = _release_for(_family("kv-first"))
    other = _family("blocks-first")
    kv = _filled(other, _dims(other, 3))
    try:
        with in_force(_layer(other, _dims(other, 3), release)):  # the release's own layer, not the contract's
            got = ModeloptSubject(release).split(kv, _layer(_family("kv-first"), _dims(other, 3), release))
    except ContractError:
        return
    assert split_mismatch(got, views.split(other, kv)) is not None


def test_recorded_release_maps_to_its_backend_methods() -> None:
    assert {"get_kv_cache_shape", "get_kv_cache_stride_order"} <= SHAPE_ERA.backend_methods
    assert not {"get_kv_cache_shape", "get_kv_cache_stride_order"} & ENUM_ERA.backend_methods
    with pytest.raises(ContractError, match="records no layout API"):
        VllmRelease.from_recording(Recording("x", (families()[0],), {}))


def test_the_plugin_asks_the_replayed_release_stand_in() -> None:
    # The plugin's sentinel question, answered by the stand-in from the recording's model (not by modelopt).
    be = backend_class(SHAPE_ERA.recording, "FLASH_ATTN")
    fa = next(c for c in SHAPE_ERA.recording.contracts if c.origin.backend_name == "FLASH_ATTN")
    assert be.get_kv_cache_shape(3, 16, 1, 16) == tuple(
        {"KV": 2, "B": 3, "N": 16, "H": 1, "D": 16, "C": 32}[a] for a in fa.layout.logical)
    assert not hasattr(backend_class(ENUM_ERA.recording, "FLASH_ATTN"), "get_kv_cache_shape")


def test_a_replayed_split_leaves_no_stand_in_behind() -> None:
    contract = _family("blocks-first")
    _split(ModeloptSubject(_release_for(contract)), views.allocate(contract, _dims(contract, 3), torch.float16),
           contract, _dims(contract, 3))
    import modelopt.torch.sparsity.attention_sparsity.plugins.vllm as plugin

    assert not [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]
    assert plugin.FlashAttentionBackend.__doc__.startswith("REPLAY stand-in for vLLM")
    assert not hasattr(sys.modules[plugin.__name__], "replay_backend")


# --- what modelopt itself refuses, and its FlashInfer adapter ----------------------------------------------------

import modelopt.torch.sparsity.attention_sparsity.plugins.vllm as _plugin  # noqa: E402

from kvconform.subjects import modelopt as adapter  # noqa: E402

INSTALLER = importlib.util.find_spec(adapter.RUNTIME)


@pytest.mark.skipif(INSTALLER is None, reason=f"nvidia-modelopt {VERSION} has no {adapter.RUNTIME}")
def test_each_refusal_cites_a_line_of_the_installed_modelopt_that_makes_it() -> None:
    # The adapter refuses nothing of its own: each refusal names a line of modelopt that holds its words, so a
    # modelopt that moves or drops one fails here rather than leaving kvconform refusing on its behalf.
    root = Path(INSTALLER.origin).parents[5]
    for r in adapter.REFUSALS:
        path, line = r.where.split(":")
        text = (root / "modelopt/torch/sparsity/attention_sparsity" / path).read_text().splitlines()[int(line) - 1]
        words = r.says.split(": ", 1)[-1].split(" (")[0].split("{")[0].split("=")[0]
        assert words in text, f"{r.where} reads {text.strip()!r}, not {words!r}"


def _layer_of(recorded: str, **change):
    rec = store.load(recorded)
    c = next(c for c in rec.contracts if c.origin.backend_name == "FLASH_ATTN" and c.cache_dtype == "auto")
    layer = layer_for(c, Dims(3, 16, 2, 64), torch.float16, backend_class(rec, "FLASH_ATTN"), recorded, rec)
    return dataclasses.replace(layer, **change)


@pytest.mark.skipif(INSTALLER is None, reason=f"nvidia-modelopt {VERSION} has no {adapter.RUNTIME}")
@pytest.mark.parametrize(("change", "where"), [
    ({"release": "0.14.1"}, "vllm_runtime.py:145"), ({"head_size": 72, "head_size_v": 72}, "vllm_runtime.py:217"),
    ({"head_size_v": 32}, "vllm_runtime.py:220"), ({"cache_dtype": "fp8_e5m2"}, "vllm_runtime.py:226"),
    ({"cache_dtype": "fp8_per_token_head"}, "vllm_runtime.py:226")])
def test_modelopt_refuses_what_its_installer_refuses(change: dict, where: str) -> None:
    assert ModeloptSubject().supports_layer(_layer_of("0.25.1")) is None
    assert where in ModeloptSubject().supports_layer(_layer_of("0.25.1", **change))


def test_modelopt_refuses_no_cache_dtype_its_installer_takes() -> None:
    assert ModeloptSubject().supports_layer(_layer_of("0.25.1", cache_dtype="nvfp4")) is None


def test_without_the_installer_modelopt_refuses_no_layer() -> None:
    no_installer = dataclasses.replace(adapter._load(), installer=False)
    with mock.patch.object(adapter, "_load", lambda: no_installer):
        assert ModeloptSubject().supports_layer(_layer_of("0.25.1", cache_dtype="fp8_e4m3", head_size_v=32)) is None
        assert ModeloptSubject().backends == ("FLASH_ATTN",)


def _flashinfer(release: str, cache_dtype: str = "auto") -> list[Contract]:
    return [c for c in dict.fromkeys(store.load(release).contracts)
            if c.origin.backend_name == "FLASHINFER" and c.cache_dtype == cache_dtype]


@pytest.mark.skipif(not hasattr(_plugin, adapter.FLASHINFER), reason=f"nvidia-modelopt {VERSION} has no FlashInfer path")
@pytest.mark.parametrize("cache_dtype", ["auto", "nvfp4"])
def test_the_flashinfer_adapter_takes_a_blocks_first_cache_as_it_is(cache_dtype: str) -> None:
    assert "FLASHINFER" in ModeloptSubject().backends
    rec = store.load("0.25.1")
    for contract in _flashinfer("0.25.1", cache_dtype):
        dims = Dims(3, 16, 2, 32)
        kv = views.allocate(contract, dims, torch.float16)
        layer = layer_for(contract, dims, torch.float16, backend_class(rec, "FLASHINFER"), "0.25.1", rec)
        with in_force(layer):
            got = ModeloptSubject().split(kv, layer)
        assert split_mismatch(got, views.split(contract, kv, dims)) is None


@pytest.mark.skipif(not hasattr(_plugin, adapter.FLASHINFER), reason=f"nvidia-modelopt {VERSION} has no FlashInfer path")
def test_the_flashinfer_adapter_refuses_a_four_axis_cache_in_its_own_words() -> None:
    rec = store.load("0.28.0")
    contract = _flashinfer("0.28.0", "nvfp4")[0]
    dims = Dims(3, 16, 2, 32)
    layer = layer_for(contract, dims, torch.float16, backend_class(rec, "FLASHINFER"), "0.28.0", rec)
    with in_force(layer), pytest.raises(ContractError, match=r"ValueError: FlashInfer KV cache must have logical "
                                                             r"shape \[blocks, 2, page, heads, dim\]"):
        ModeloptSubject().split(views.allocate(contract, dims, torch.float16), layer)


# --- the kernel, paged vs dense, in Triton's interpreter ---------------------------------------------------------

SUBJECT = ModeloptSubject(SHAPE_ERA)
MODES = [Sparsity(), Sparsity("skip_softmax", threshold=0.3), Sparsity("nm", n=2, m=4, sink=2, recent=8)]
MIXED = dict(q_lens=(1, 5, 20), kv_lens=(7, 5, 37), num_heads=4, kv_heads=2, head_dim=32, block_size=16)


def _paged(case: Case, contract: Contract):
    """Tokens written through the contract's views (where the release puts them), read through the plugin's."""
    q, k, v = case.inputs()
    layers = dict(num_layers=3, layer=1) if contract.layout.shared else {}
    dims = Dims(case.blocks_needed() + 2, case.block_size, case.kv_heads, case.head_dim, **layers)
    kv = views.allocate(contract, dims, case.torch_dtype)
    pg = paging(case.kv_lens, case.block_size, dims.num_blocks, seed=case.seed)
    write(*views.split(contract, kv, dims), pg, k, v)
    k_cache, v_cache = _split(ModeloptSubject(_release_for(contract)), kv, contract, dims)
    return q, k, v, k_cache, v_cache, pg


@pytest.mark.parametrize("sparsity", MODES, ids=lambda s: s.mode)
@pytest.mark.parametrize("contract", [_family("kv-first"), _family("blocks-first"), _family("packed"),
                                      next(c for c in CONTRACTS if c.layout.family == "blocks-first" and c.layout.shared)],
                         ids=lambda c: c.name)
def test_paged_is_bit_identical_to_dense_with_a_pinned_tile(contract: Contract, sparsity: Sparsity) -> None:
    case = Case(**MIXED, sparsity=sparsity, dtype="bfloat16" if sparsity.mode == "nm" else "float16")
    tile = SUBJECT.tile_config(case)
    q, k, v, k_cache, v_cache, pg = _paged(case, contract)
    paged = SUBJECT.paged_forward(case, q, k_cache, v_cache, pg, tile)
    assert SUBJECT.last_tile == tile
    dense = SUBJECT.dense_forward(case, q, k, v, tile)
    assert not paged.isnan().any()  # no poisoned spare page was read
    assert_bit_identical(paged, dense, f"modelopt {contract.name} {sparsity}")


def test_a_wrong_split_makes_paged_differ_from_dense() -> None:
    contract = _family("blocks-first")
    case = Case(**MIXED)
    tile = SUBJECT.tile_config(case)
    q, k, v, k_cache, v_cache, pg = _paged(case, contract)
    swapped = SUBJECT.paged_forward(case, q, v_cache, k_cache, pg, tile)
    assert diagnose(swapped, SUBJECT.dense_forward(case, q, k, v, tile)) is not None


def test_a_different_tile_is_not_bit_identical() -> None:
    # Why the bit-identity lane pins: the same inputs under another tile round differently.
    case = Case(q_lens=(40,), kv_lens=(200,), num_heads=2, kv_heads=1, head_dim=32, block_size=16)
    q, k, v = case.inputs()
    a = SUBJECT.dense_forward(case, q, k, v, TileConfig(64, 32, 4, 2))
    b = SUBJECT.dense_forward(case, q, k, v, TileConfig(16, 64, 4, 2))
    assert diagnose(a, b) is not None


def test_dense_kernel_agrees_with_the_oracle_without_sparsity() -> None:
    case = Case(**MIXED)
    q, k, v = case.inputs()
    out = SUBJECT.dense_forward(case, q, k, v, SUBJECT.tile_config(case)).double()
    # fp16 inputs, fp32 accumulation: a few fp16 ulps of max|V| (about 4) is the rounding budget.
    assert (out - reference.attention(case, q, k, v, 32)).abs().max() < 4 * 2**-11 * v.abs().max()


# Each case, with its q scaled up where a larger q spreads the scores so skip-softmax drops tiles.
DECLARED = {
    "none_mixed": (Case(**MIXED), 1.0),
    "skip_prefill": (Case(q_lens=(70,), kv_lens=(70,), num_heads=2, kv_heads=1, head_dim=32, block_size=16,
                          sparsity=Sparsity("skip_softmax", threshold=0.3)), 4.0),
    "skip_mixed": (Case(**MIXED, sparsity=Sparsity("skip_softmax", threshold=0.7)), 4.0),
    "nm4_mixed": (Case(**MIXED, sparsity=Sparsity("nm", n=2, m=4, sink=2, recent=8)), 1.0),
    "nm8_noncausal": (Case(q_lens=(1, 9), kv_lens=(40, 50), num_heads=2, kv_heads=1, head_dim=32, block_size=16,
                           causal=False, sparsity=Sparsity("nm", n=3, m=8, sink=1, recent=5)), 1.0),
}


def _judged(case: Case, q_factor: float, semantics: SparsitySemantics):
    q, k, v = case.inputs()
    q = (q.float() * q_factor).to(q.dtype)
    tile = SUBJECT.tile_config(case)
    out = SUBJECT.dense_forward(case, q, k, v, tile)
    return oracle_check.judge(case, out, q, k, v, tile, semantics)


@pytest.mark.parametrize("name", list(DECLARED))
def test_dense_forward_passes_the_oracle_under_its_declared_semantics(name: str) -> None:
    assert semantics_of(SUBJECT) == SparsitySemantics(skip_decision="query_tile", nm_dense_decode_rows=True,
                                                      recent_window="to_query", nm_tied_kept=(8,))
    verdict = _judged(*DECLARED[name], semantics_of(SUBJECT))
    assert verdict.word == "within-tolerance", verdict.diagnosis


def test_each_declared_rule_is_needed() -> None:
    # Under the built-in's rule in its place, each case differs: N:M decode rows kept dense, the recent window
    # ending at the query, skip decided per query tile.
    decode = Case(q_lens=(1,), kv_lens=(64,), num_heads=2, kv_heads=1, head_dim=32, block_size=16,
                  sparsity=Sparsity("nm", n=1, m=4))
    window = Case(q_lens=(12,), kv_lens=(40,), num_heads=2, kv_heads=1, head_dim=32, block_size=16, causal=False,
                  sparsity=Sparsity("nm", n=1, m=4, recent=8))
    declared = semantics_of(SUBJECT)
    for case, rule in ((decode, dict(nm_dense_decode_rows=False)), (window, dict(recent_window="to_kv_end")),
                       (DECLARED["skip_prefill"][0], dict(skip_decision="row"))):
        q_factor = DECLARED["skip_prefill"][1] if case.sparsity.mode == "skip_softmax" else 1.0
        assert _judged(case, q_factor, declared).word == "within-tolerance"
        assert _judged(case, q_factor, dataclasses.replace(declared, **rule)).word == "differs", rule


# --- installation and version selection ------------------------------------------------------------------------

def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_module_imports_without_modelopt_and_says_how_to_install() -> None:
    run = _python("import sys; sys.modules['modelopt'] = None\n"
                  "from kvconform.subjects.modelopt import ModeloptSubject, ModeloptUnavailable\n"
                  "try:\n    ModeloptSubject().version\nexcept ModeloptUnavailable as e:\n    print(e)")
    assert run.returncode == 0, run.stderr
    assert "pip install .[modelopt]" in run.stdout


def test_a_version_other_than_the_installed_one_is_refused() -> None:
    run = _python("from kvconform.subjects.modelopt import ModeloptSubject, ModeloptUnavailable\n"
                  "try:\n    ModeloptSubject().version\nexcept ModeloptUnavailable as e:\n    print(e)",
                  KVCONFORM_MODELOPT="0.0.1")
    assert run.returncode == 0, run.stderr
    assert "KVCONFORM_MODELOPT=0.0.1 but nvidia-modelopt" in run.stdout and "nvidia-modelopt==0.0.1" in run.stdout


def test_bad_input_is_refused_before_any_launch() -> None:
    contract = _family("kv-first")
    case = Case(**MIXED)
    tile = SUBJECT.tile_config(case)
    q, k, v, k_cache, v_cache, pg = _paged(case, contract)
    bad_table = type(pg)(pg.block_table.clone(), pg.slot_mapping, pg.kv_lens, pg.block_size)
    bad_table.block_table[2, 0] = k_cache.shape[0]
    with pytest.raises(ValueError, match=r"row 2 \(kv_len 37\) holds pages"):
        SUBJECT.paged_forward(case, q, k_cache, v_cache, bad_table, tile)
    with pytest.raises(ValueError, match=r"k_cache shape \(.*\) strides .* is not a \[num_blocks, block_size"):
        SUBJECT.paged_forward(case, q, k_cache[:, :8], v_cache, pg, tile)
    with pytest.raises(ValueError, match="head_dim stride is 2"):
        SUBJECT.dense_forward(case, q, k, torch.stack([v, v], -1).flatten(-2)[..., ::2], tile)
    with pytest.raises(ValueError, match="head_dim 8 not supported"):
        small = Case(**{**MIXED, "head_dim": 8})
        SUBJECT.dense_forward(small, *small.inputs(), tile)
    with pytest.raises(ValueError, match="block_n must be a multiple of the nm group size m=8"):
        nm = Case(**MIXED, sparsity=Sparsity("nm", n=2, m=8))
        SUBJECT.dense_forward(nm, q, k, v, TileConfig(16, 4, 4, 1))


def test_pinning_is_undone_and_unpinned_calls_run_modelopts_own_candidates() -> None:
    import modelopt.torch.kernels.common.attention.triton_fa as fa

    own = fa._attn_fwd.configs
    case = Case(**MIXED)
    q, k, v = case.inputs()
    SUBJECT.dense_forward(case, q, k, v, TileConfig(16, 64, 4, 1))
    assert fa._attn_fwd.configs is own
    SUBJECT.dense_forward(case, q, k, v, None)
    assert fa._attn_fwd.configs is own
    # In the interpreter the tuner keeps its list as it stands (under pytest modelopt's first config alone).
    assert SUBJECT.last_tile in SUBJECT.autotune_configs(case) == tuple(
        TileConfig(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in own)


def test_autotune_is_declared_only_where_the_autotuner_can_time_its_candidates() -> None:
    assert capabilities_of(SUBJECT) == {"split", "forward"}  # the interpreter: ulp-autotuned not applicable
    import modelopt.torch.kernels.common.attention.triton_fa as fa

    cuda = mock.patch.object(torch.cuda, "is_available", lambda: True)
    with cuda, mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
        assert capabilities_of(SUBJECT) == {"split", "forward", "autotune"}
        # All of modelopt's production candidates, not the one it keeps under pytest; BLOCK_N 32 in each.
        assert len(SUBJECT.autotune_configs(Case(**MIXED))) == len(fa._FWD_CONFIGS) > len(fa._attn_fwd.configs)
        assert {t.block_n for t in SUBJECT.autotune_configs(Case(**MIXED))} == {32}


FIRST_CALL_IN_A_REPLAYED_LAYER = """
import torch
from harness import contract
from harness.recordings import store
from harness.contract import views
from harness.run import releases, session as sessions
from harness.handed.layer import in_force
from kvconform.subjects.modelopt import ModeloptSubject

subject = ModeloptSubject()  # modelopt is first imported inside the calls below, under their releases' stand-ins
for release in ("0.25.1", "0.29.0"):
    r = releases.load_release(release, store.ROOT)
    c = next(c for c in r.contracts if c.origin.backend_name == "FLASH_ATTN" and c.cache_dtype == "auto")
    dims = contract.Dims(3, 16, 2, 32, 3 if c.layout.shared else 1, 1 if c.layout.shared else 0)
    layer = sessions.layer_of(r, c, dims, torch.float16)
    kv = views.allocate(c, dims, torch.float16)
    with in_force(layer):
        try:
            print(release, "split", tuple(subject.split(kv, layer)[0].shape))
        except Exception as e:
            print(release, "refused", "live vLLM" in str(e), f"REPLAY of vLLM {release}" in str(e))
"""


def test_a_first_split_inside_a_replayed_call_replays_that_release():
    # As the suites call it: the first split happens with the layer's stand-ins installed, which must not read as a
    # live vLLM; each release is replayed as itself.
    run = _python(FIRST_CALL_IN_A_REPLAYED_LAYER)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[-3:-1] == ["0.25.1 split (3, 16, 2, 32)", "0.29.0 refused False True"], run.stdout
