"""The probe adapters against small fakes of each vLLM API era (no vLLM needed).

Each fake is a few lines of the era's real API: FlashAttentionBackend's shape / stride-order methods, the env
switch read through functools.lru_cache, the KV-connector's cross-layer allocator, the KVCacheLayout enum and view
builder, and an impl whose write path calls `reshape_and_cache_flash` the way that era does. Expected contracts
are written out by hand from vLLM's documented shapes, not taken from the probe.
"""

from __future__ import annotations

import enum
import functools
import math
import os
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from harness import probe as p
from harness.contract import Contract

KV_FIRST, BLOCKS_FIRST, PACKED = ("KV", "B", "N", "H", "D"), ("B", "KV", "N", "H", "D"), ("B", "H", "N", "C")


def _mod(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    vars(m).update(attrs)
    return m


def _envs() -> types.ModuleType:
    @functools.lru_cache
    def __getattr__(name):  # vllm.envs caches env reads once enable_envs_cache() ran
        return os.environ.get(name)

    return _mod("vllm.envs", __getattr__=__getattr__)


@dataclass(frozen=True)
class Spec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads

    @property
    def state_content_size_bytes(self) -> int:
        return self.page_size_bytes


def _install(monkeypatch, modules: dict[str, types.ModuleType]) -> None:
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    modules = {"vllm": _mod("vllm"), "vllm.envs": _envs(), **modules}
    for name, m in modules.items():
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setattr(p, "release", lambda: "0.0.fake")


def _split(family: str, kv_cache: torch.Tensor, head_size: int, swap: bool):
    if family == "kv-first":
        k, v = kv_cache.unbind(0)
    elif family == "blocks-first":
        k, v = kv_cache.unbind(1)
    else:
        k, v = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return (v, k) if swap else (k, v)


def _shape_era(
    monkeypatch, family="kv-first", stride="layers", write="method", swap=False, torch_ops=False
) -> None:
    """A release of the shape-method eras: 0.8.5 (stride=None, write=forward, torch_ops), 0.9-0.11 (stride=plain),
    0.12-0.14 (stride=layers, write=forward), 0.15-0.28 (write=method; family kv-first, blocks-first, packed)."""
    fa = _mod("vllm.v1.attention.backends.flash_attn", AttentionType=types.SimpleNamespace(DECODER="decoder"))

    @functools.lru_cache
    def get_kv_cache_layout():
        return os.environ.get("VLLM_KV_CACHE_LAYOUT") or "NHD"

    orders = {  # (layout, with layers) -> stride order, as each family's get_kv_cache_stride_order answers
        "kv-first": {("NHD", False): (0, 1, 2, 3, 4), ("HND", False): (0, 1, 3, 2, 4),
                     ("NHD", True): (2, 0, 1, 3, 4, 5), ("HND", True): (2, 4, 0, 1, 3, 5)},
        "blocks-first": {("NHD", False): (0, 1, 2, 3, 4), ("HND", False): (0, 1, 3, 2, 4),
                         ("NHD", True): (1, 0, 2, 3, 4, 5), ("HND", True): (1, 4, 0, 2, 3, 5)},
        "packed": {("NHD", False): (0, 2, 1, 3), ("HND", False): (0, 1, 2, 3),
                   ("NHD", True): (1, 0, 3, 2, 4), ("HND", True): (1, 2, 0, 3, 4)},
    }[family]

    class AttentionBackend:  # 0.8.5's abstract base: the stride order is declared but not implemented
        @staticmethod
        def get_kv_cache_stride_order():
            raise NotImplementedError

    class FlashAttentionBackend(AttentionBackend):
        @staticmethod
        def get_name():
            return "FLASH_ATTN"

        @staticmethod
        def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
            return {
                "kv-first": (2, num_blocks, block_size, num_kv_heads, head_size),
                "blocks-first": (num_blocks, 2, block_size, num_kv_heads, head_size),
                "packed": (num_blocks, num_kv_heads, block_size, 2 * head_size),
            }[family]

    def plain_order():
        layout = get_kv_cache_layout()
        if layout not in ("NHD", "HND"):
            raise ValueError(f"Unknown cache layout format {layout}.")
        return orders[(layout, False)]

    def layers_order(include_num_layers_dimension: bool = False):
        plain_order()
        return orders[(get_kv_cache_layout(), include_num_layers_dimension)]

    if stride == "plain":
        FlashAttentionBackend.get_kv_cache_stride_order = staticmethod(plain_order)
    elif stride == "layers":
        FlashAttentionBackend.get_kv_cache_stride_order = staticmethod(layers_order)

    def op():
        return torch.ops._C_cache_ops.reshape_and_cache_flash if torch_ops else fa.reshape_and_cache_flash

    class FlashAttentionImpl:
        def _write(self, layer, key, value, kv_cache, slot_mapping):
            k, v = _split(family, kv_cache, self.head_size, swap)
            op()(key, value, k, v, slot_mapping, self.kv_cache_dtype, layer._k_scale, layer._v_scale)

        if write == "method":
            def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
                self._write(layer, key, value, kv_cache, slot_mapping)
        else:
            def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
                self._write(layer, key, value, kv_cache, attn_metadata.slot_mapping)
                raise RuntimeError("flash_attn_varlen_func needs CUDA")  # the probe must stop before this

    FlashAttentionBackend.get_impl_cls = staticmethod(lambda: FlashAttentionImpl)
    fa.FlashAttentionBackend, fa.FlashAttentionImpl = FlashAttentionBackend, FlashAttentionImpl
    modules = {
        fa.__name__: fa,
        "vllm.v1.attention.backends.utils": _mod("u", get_kv_cache_layout=get_kv_cache_layout),
        "vllm.v1.kv_cache_interface": _mod("i", FullAttentionSpec=Spec),
    }
    if stride == "layers":
        modules["vllm.v1.worker.kv_connector_model_runner_mixin"] = _mod(
            "m", KVConnectorModelRunnerMixin=types.SimpleNamespace(allocate_uniform_kv_caches=_allocate_uniform)
        )
    _install(monkeypatch, modules)


def _allocate_uniform(kv_cache_config, attn_groups, cache_dtype, device, kernel_block_sizes):
    # vLLM's allocator: (num_layers,) + shape, allocated in stride order, permuted back, one view per layer.
    group = attn_groups[0][0]
    spec, backend = group.kv_cache_spec, group.backend
    tensors = kv_cache_config.kv_cache_tensors
    num_blocks = tensors[0].size // spec.page_size_bytes
    shape = (len(tensors),) + backend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    order = backend.get_kv_cache_stride_order(include_num_layers_dimension=True)
    whole = torch.zeros(math.prod(shape) * spec.dtype.itemsize, dtype=torch.int8, device=device)
    whole = whole.view(spec.dtype).view([shape[i] for i in order])
    permuted = whole.permute(*[order.index(i) for i in range(len(order))])
    return {n: permuted[i] for i, t in enumerate(tensors) for n in t.shared_by}, whole, backend


class KVCacheLayout(enum.Enum):
    LBHNC = (0, 1, 2, 3, 4)
    LBNHC = (0, 1, 3, 2, 4)
    LHBNC = (0, 2, 1, 3, 4)
    BLHNC = (1, 0, 2, 3, 4)
    BLNHC = (1, 0, 3, 2, 4)
    BHLNC = (1, 2, 0, 3, 4)

    @property
    def stride_order(self):
        return self.value


def _enum_era(monkeypatch, lie: bool = False) -> None:
    """0.29+: no shape method; the enum's stride order over [L, B, H, N, C] and a flat-buffer view builder.
    `lie` makes the builder ignore the order (always LBHNC), which the probe must catch."""

    def shape(spec, num_blocks, num_layers):
        return (num_layers, num_blocks, spec.num_kv_heads, spec.block_size, 2 * spec.head_size * spec.dtype.itemsize)

    def compute_layout_strides(spec, num_blocks, num_layers, layout):
        dims, strides, step = shape(spec, num_blocks, num_layers), [0] * 5, 1
        for d in reversed(KVCacheLayout.LBHNC.value if lie else layout.stride_order):
            strides[d], step = step, step * dims[d]
        return tuple(strides)

    @dataclass
    class KVCacheTensor:
        size: int
        layers: list
        layer_stride: int
        block_stride: int
        offset: int = 0

    def create_kv_cache_views(raw, spec, num_blocks, layout, tensor):
        strides = compute_layout_strides(spec, num_blocks, len(tensor.layers), layout)
        view = torch.as_strided(raw, shape(spec, num_blocks, len(tensor.layers)), strides, tensor.offset)
        return [view[i].view(spec.dtype) for i in range(len(tensor.layers))]

    fa = _mod("vllm.v1.attention.backends.flash_attn", AttentionType=types.SimpleNamespace(DECODER="decoder"))

    class FlashAttentionBackend:
        @staticmethod
        def get_name():
            return "FLASH_ATTN"

        @classmethod
        def supported_kv_cache_layouts(cls):
            return None

    class FlashAttentionImpl:
        def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
            k, v = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
            fa.reshape_and_cache_flash(key, value, k, v, slot_mapping, self.kv_cache_dtype, layer._k_scale, layer._v_scale)

    FlashAttentionBackend.get_impl_cls = staticmethod(lambda: FlashAttentionImpl)
    fa.FlashAttentionBackend, fa.FlashAttentionImpl = FlashAttentionBackend, FlashAttentionImpl
    iface = _mod(
        "vllm.v1.kv_cache_interface",
        FullAttentionSpec=Spec,
        KVCacheTensor=KVCacheTensor,
        compute_layout_strides=compute_layout_strides,
        create_kv_cache_views=create_kv_cache_views,
    )
    _install(monkeypatch, {fa.__name__: fa, iface.__name__: iface,
                           "vllm.v1.kv_cache_layout": _mod("l", KVCacheLayout=KVCacheLayout)})


def _c(logical, *physical) -> set[Contract]:
    return {Contract.of(logical, tuple(ph.split("."))) for ph in physical}


def test_shape_only_era_reads_one_kv_first_contract(monkeypatch):
    _shape_era(monkeypatch, stride=None, write="forward", torch_ops=True)
    rec = p.probe()
    assert rec.observations["era"] == "era_shape"
    assert set(rec.contracts) == _c(KV_FIRST, "KV.B.N.H.D")
    write = rec.observations["backends"]["FLASH_ATTN"]["settings"]["auto default"]["write"]
    assert (write["path"], write["K"], write["V"]) == ("FlashAttentionImpl.forward", "KV=0", "KV=1")


def test_stride_order_era_reads_both_switch_values(monkeypatch):
    _shape_era(monkeypatch, stride="plain", write="forward")
    rec = p.probe()
    assert rec.observations["era"] == "era_stride"
    assert set(rec.contracts) == _c(KV_FIRST, "KV.B.N.H.D", "KV.B.H.N.D")
    assert "HND" in [c for c in rec.contracts if c.layout.physical == ("KV", "B", "H", "N", "D")][0].origin.setting
    assert "XYZ" in rec.observations["rejects"]
    assert os.environ.get("VLLM_KV_CACHE_LAYOUT") is None  # the switch is restored


def test_cross_layer_era_reads_the_connector_allocation(monkeypatch):
    _shape_era(monkeypatch, stride="layers", write="forward")
    rec = p.probe()
    assert set(rec.contracts) == _c(KV_FIRST, "KV.B.N.H.D", "KV.B.H.N.D", "B.L.KV.N.H.D", "B.H.L.KV.N.D")


@pytest.mark.parametrize(
    "family, logical, expected",
    [
        ("kv-first", KV_FIRST, ("KV.B.N.H.D", "KV.B.H.N.D", "B.L.KV.N.H.D", "B.H.L.KV.N.D")),
        ("blocks-first", BLOCKS_FIRST, ("B.KV.N.H.D", "B.KV.H.N.D", "B.L.KV.N.H.D", "B.H.L.KV.N.D")),
        ("packed", PACKED, ("B.N.H.C", "B.H.N.C", "B.L.N.H.C", "B.H.L.N.C")),
    ],
)
def test_write_method_era_reads_each_family(monkeypatch, family, logical, expected):
    _shape_era(monkeypatch, family=family, stride="layers", write="method")
    rec = p.probe()
    assert rec.observations["era"] == "era_write"
    assert set(rec.contracts) == _c(logical, *expected)
    k_at = "C[0:32]" if family == "packed" else "KV=0"
    for obs in rec.observations["backends"]["FLASH_ATTN"]["settings"].values():
        assert obs["write"]["K"] == k_at and obs["write"]["stray_cells"] == 0


def test_enum_era_reads_every_layout_single_and_cross_layer(monkeypatch):
    _enum_era(monkeypatch)
    rec = p.probe()
    assert rec.observations["era"] == "era_enum"
    assert set(rec.contracts) == _c(
        PACKED, "B.H.N.C", "B.N.H.C", "H.B.N.C",
        "L.B.H.N.C", "L.B.N.H.C", "L.H.B.N.C", "B.L.H.N.C", "B.L.N.H.C", "B.H.L.N.C",
    )
    shared = [c for c in rec.contracts if c.layout.physical == ("B", "N", "H", "C")][0]
    assert "LBNHC single-layer" in shared.origin.setting and "BLNHC single-layer" in shared.origin.setting
    # The fake has the layer-level API only: the whole-model allocation is said not read, and why.
    assert rec.observations["allocations"] == {"read": False, "why": "none of vllm.v1.core.kv_cache_planning, "
                                               "vllm.v1.core.kv_cache_utils has get_kv_cache_groups and "
                                               "get_kv_cache_config_from_groups"}


def test_enum_and_view_builder_disagreeing_is_a_probe_error(monkeypatch):
    _enum_era(monkeypatch, lie=True)
    with pytest.raises(p.ProbeError, match="declares physical order B.N.H.C but create_kv_cache_views built"):
        p.probe()


@pytest.mark.parametrize("family", ["kv-first", "packed"])
def test_a_release_writing_v_where_k_belongs_is_a_probe_error(monkeypatch, family):
    _shape_era(monkeypatch, family=family, swap=True)
    with pytest.raises(p.ProbeError, match="writes K at (KV=1|C\\[32:64\\])"):
        p.probe()


def test_release_with_none_of_the_known_apis_names_what_is_missing(monkeypatch):
    fa = _mod("vllm.v1.attention.backends.flash_attn", FlashAttentionBackend=type("FlashAttentionBackend", (), {}))
    _install(monkeypatch, {fa.__name__: fa})
    with pytest.raises(p.ProbeError) as e:
        p.probe()
    msg = str(e.value)
    assert "vllm 0.0.fake" in msg
    assert "no vllm.v1.kv_cache_layout.KVCacheLayout" in msg
    assert "FlashAttentionBackend has no get_kv_cache_shape" in msg


def test_probe_without_vllm_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setattr(p.importlib.metadata, "version", _not_found)
    with pytest.raises(p.ProbeError, match="vllm is not installed"):
        p.probe()


def _not_found(name):
    raise p.importlib.metadata.PackageNotFoundError(name)


def test_a_backend_module_that_fails_to_import_is_recorded_unreadable_and_named_by_the_drift_check(
        monkeypatch, tmp_path):
    from harness.backends import BACKENDS
    from harness.probe import era_write
    from harness.recordings import drift, store

    (tmp_path / "flashinfer.py").write_text("import kvconform_no_such_dependency\n")
    (tmp_path / "triton_attn.py").write_text("from vllm.v1.attention.backends import no_such_name\n")
    for name in ("vllm", "vllm.v1", "vllm.v1.attention"):
        monkeypatch.setitem(sys.modules, name, _mod(name, __path__=[]))
    pkg = "vllm.v1.attention.backends"
    monkeypatch.setitem(sys.modules, pkg, _mod(pkg, __path__=[str(tmp_path)]))
    results = {b.name: p._backend("0.26.0", era_write, b) for b in BACKENDS
               if b.name in ("FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")}
    observed = {name: obs for name, (_, obs) in results.items()}

    assert all(contracts == () for contracts, _ in results.values())
    assert observed["FLASHINFER"] == {"present": True, "read": False, "why": (
        f"not importable: importing {pkg}.flashinfer raised ModuleNotFoundError: No module named "
        "'kvconform_no_such_dependency'")}
    assert observed["TRITON_ATTN"]["read"] is False
    assert observed["TRITON_ATTN"]["why"].startswith(
        f"not importable: importing {pkg}.triton_attn raised ImportError: cannot import name 'no_such_name'")
    assert observed["FLEX_ATTENTION"]["present"] is False  # no module at all: absent from the release

    fi = Contract.of(BLOCKS_FIRST, BLOCKS_FIRST, "vllm 0.26.0 FLASHINFER VLLM_KV_CACHE_LAYOUT=NHD")
    read = {"present": True, "read": True}
    recorded = store.Recording("0.26.0", (fi,), {"backends": {"FLASHINFER": read, "TRITON_ATTN": read}})
    lines = drift.drift(recorded, store.Recording("0.26.0", (), {"backends": observed}))
    assert lines == [f"backend FLASHINFER could not be imported or read: {observed['FLASHINFER']['why']}; the "
                     "recording read 1 contract from it",
                     f"backend TRITON_ATTN could not be imported or read: {observed['TRITON_ATTN']['why']}"]


def test_the_probe_records_the_layout_api_and_its_stand_in_answers_like_the_release(monkeypatch):
    from harness.backends import layout_env
    from harness.recordings import drift
    from harness.vllm_api.standins import StandIns
    from harness.vllm_api.surface import Api

    _shape_era(monkeypatch, family="blocks-first", stride="layers", write="method")
    rec = p.probe()
    fa = sys.modules["vllm.v1.attention.backends.flash_attn"].FlashAttentionBackend
    assert {"get_kv_cache_shape", "get_kv_cache_stride_order"} <= set(rec.api["backends"]["FLASH_ATTN"]["members"])
    stand = StandIns(Api.from_json("0.0.fake", rec.api, "the fake"), rec.contracts).backend("FLASH_ATTN")
    for args in [(9, 32, 5, 48), (1234, 16, 8, 128), (1, 16, 1, 16)]:  # sizes the probe never asked
        assert stand.get_kv_cache_shape(*args) == tuple(fa.get_kv_cache_shape(*args))
    for setting in ("NHD", "HND"):
        for flag in (False, True):
            with layout_env(setting):
                assert stand.get_kv_cache_stride_order(flag) == tuple(fa.get_kv_cache_stride_order(flag))
    # The same release with another shape: the live drift check names the answers that moved.
    _shape_era(monkeypatch, family="packed", stride="layers", write="method")
    moved = drift.drift(rec, p.probe())
    assert any(line.startswith("layout API: FLASH_ATTN: ") and "get_kv_cache_shape" in line for line in moved), moved
