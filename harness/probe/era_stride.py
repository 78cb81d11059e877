"""vLLM 0.9 - 0.14: FlashAttentionBackend.get_kv_cache_shape + get_kv_cache_stride_order, switched NHD/HND by
VLLM_KV_CACHE_LAYOUT (read through a functools.lru_cache); from 0.12 the stride order also answers
include_num_layers_dimension=True and the KV-connector mixin allocates one cross-layer tensor. The cache write is
the first thing FlashAttentionImpl.forward does; the scatter stops forward right after it.

`read` is shared with era_shape (no stride order) and era_write (write method instead of forward).
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable
from typing import Any

import torch

from harness.probe import observe as p
from harness.backends import LAYOUT_ENV, LAYOUT_VALUES, layout_env
from harness.contract import Dims
from harness.fixtures import Recording

FA = "vllm.v1.attention.backends.flash_attn"
MIXIN = "vllm.v1.worker.kv_connector_model_runner_mixin"
SINGLE = Dims(p.DIMS.num_blocks, p.DIMS.block_size, p.DIMS.kv_heads, p.DIMS.head_dim)


def backend() -> tuple[types.ModuleType | None, Any]:
    """(flash_attn module, FlashAttentionBackend), or (None, what is missing)."""
    fa = p.module(FA)
    if fa is None:
        return None, f"no module {FA}"
    be = getattr(fa, "FlashAttentionBackend", None)
    if be is None:
        return None, f"{FA} has no FlashAttentionBackend"
    if not hasattr(be, "get_kv_cache_shape"):
        return None, "FlashAttentionBackend has no get_kv_cache_shape"
    return fa, be


def missing() -> str | None:
    fa, be = backend()
    if fa is None:
        return be
    if not hasattr(be, "get_kv_cache_stride_order"):
        return "FlashAttentionBackend has no get_kv_cache_stride_order"
    # 0.8.5 inherits the abstract method, which raises NotImplementedError; vLLM's model runner treats that as
    # "no stride order" (identity), and so does the probe (era_shape).
    try:
        with layout_env(LAYOUT_VALUES[0]):
            be.get_kv_cache_stride_order()
    except NotImplementedError:
        return "FlashAttentionBackend.get_kv_cache_stride_order raises NotImplementedError"
    return None


def probe(version: str) -> Recording:
    fa, be = backend()
    return read(version, "era_stride", fa, be, forward_write(fa), stride_order=True)


def forward_write(fa: types.ModuleType) -> tuple[str, Callable]:
    """The write at the start of FlashAttentionImpl.forward, stopped by the scatter right after it."""
    impl = p.impl_for(fa.FlashAttentionImpl, fa)

    def write(key, value, kv_cache, slots):
        n = len(slots)
        meta = types.SimpleNamespace(num_actual_tokens=n, slot_mapping=slots)
        out = torch.zeros(n, p.DIMS.kv_heads * p.DIMS.head_dim)
        impl.forward(p.layer(), torch.zeros_like(key), key, value, kv_cache, meta, output=out)

    return "FlashAttentionImpl.forward", write


def read(
    version: str,
    era: str,
    fa: types.ModuleType,
    be: type,
    writer: tuple[str, Callable],
    stride_order: bool,
) -> Recording:
    path, write = writer
    calls: list = []
    stop = path.endswith("forward")
    op = p.scatter(calls, stop=stop)
    origin = f"vllm {version} {be.get_name()}"
    contracts, settings = [], {}
    with p.write_ops(fa, op):
        if not stride_order:
            c, obs = _single(be, None, f"{origin} default", path, write, calls)
            contracts.append(c)
            settings["default"] = obs
        else:
            for value in LAYOUT_VALUES:
                with layout_env(value):
                    c, obs = _single(be, be.get_kv_cache_stride_order, f"{origin} {value}", path, write, calls)
                    contracts.append(c)
                    if _has_layers_arg(be):
                        cl, obs["cross_layer"] = _cross_layer(be, f"{origin} {value} cross-layer", path, write, calls)
                        contracts.extend(cl)
                settings[f"{LAYOUT_ENV}={value}"] = obs
            # The release is also asked to reject a value the variable does not document.
            with layout_env("XYZ"):
                try:
                    be.get_kv_cache_stride_order()
                except Exception as e:  # noqa: BLE001 - any refusal will do; its text goes into the record
                    settings["rejects"] = f"{LAYOUT_ENV}=XYZ -> {type(e).__name__}: {e}"
                else:
                    raise p.ProbeError(f"vllm {version} accepts {LAYOUT_ENV}=XYZ: its switch values are not "
                                       "NHD/HND only")
    observations = {
        "era": era,
        "method": f"{'get_kv_cache_shape + get_kv_cache_stride_order' if stride_order else 'get_kv_cache_shape'}"
        f" + {path} write",
        "dims": vars(p.DIMS),
        "slots": list(p.SLOTS),
        "settings": settings,
    }
    return Recording(version, p.dedupe(contracts), observations)


def _shape(be: type) -> tuple[int, ...]:
    return tuple(be.get_kv_cache_shape(p.DIMS.num_blocks, p.DIMS.block_size, p.DIMS.kv_heads, p.DIMS.head_dim))


def _single(be, stride_order, origin, path, write, calls) -> tuple[Any, dict]:
    # As GPUModelRunner._reshape_kv_cache_tensors: allocate in stride order, permute back to the logical shape.
    shape = _shape(be)
    logical = p.axes(shape, "get_kv_cache_shape")
    order = tuple(stride_order()) if stride_order else tuple(range(len(shape)))
    if sorted(order) != list(range(len(shape))):
        raise p.ProbeError(f"get_kv_cache_stride_order() returned {order} for shape {shape}: not a permutation")
    buf = torch.empty(math.prod(shape))
    kv_cache = buf.view([shape[i] for i in order]).permute(*[order.index(i) for i in range(len(order))])
    phys = p.physical(dict(zip(logical, kv_cache.stride())))
    c = p.contract(logical, phys, origin)
    p.check_view(c, kv_cache, 0, SINGLE)
    obs = {
        "get_kv_cache_shape": list(shape),
        "stride_order": list(order) if stride_order else None,
        "kv_cache": p.view_record(kv_cache),
        "write": p.observe_write(write, kv_cache, buf, c, path, calls),
    }
    return c, obs


def _has_layers_arg(be: type) -> bool:
    return "include_num_layers_dimension" in inspect.signature(be.get_kv_cache_stride_order).parameters


def _cross_layer(be, origin, path, write, calls) -> tuple[list, dict]:
    """One allocation for all layers, built by the release's KV-connector allocator when its stride order moves
    the layer axis inward (vLLM only uses the cross-layer tensor then)."""
    shape = _shape(be)
    order = tuple(be.get_kv_cache_stride_order(include_num_layers_dimension=True))
    obs: dict[str, Any] = {"stride_order": list(order)}
    if len(order) != len(shape) + 1:
        obs["used"] = f"no: stride order {order} has no layer axis for shape {shape}"
        return [], obs
    if order[0] == 0:
        obs["used"] = "no: layers stay outermost, so vLLM allocates per layer"
        return [], obs
    mixin = p.module(MIXIN)
    allocate = getattr(getattr(mixin, "KVConnectorModelRunnerMixin", None), "allocate_uniform_kv_caches", None)
    if allocate is None:
        raise p.ProbeError(f"{MIXIN}.KVConnectorModelRunnerMixin has no allocate_uniform_kv_caches")
    spec = _spec()
    names = [f"layers.{i}" for i in range(p.DIMS.num_layers)]
    tensors = [types.SimpleNamespace(size=spec.page_size_bytes * p.DIMS.num_blocks, shared_by=[n]) for n in names]
    config = types.SimpleNamespace(kv_cache_tensors=tensors)
    groups = [[types.SimpleNamespace(kv_cache_spec=spec, backend=be)]]
    kv_caches, whole, _ = allocate(config, groups, "auto", torch.device("cpu"), [p.DIMS.block_size])
    layer0, kv_cache = kv_caches[names[0]], kv_caches[names[p.DIMS.layer]]
    logical = p.axes(tuple(kv_cache.shape), "allocate_uniform_kv_caches")
    named = dict(zip(logical, kv_cache.stride()))
    named["L"] = kv_cache.storage_offset() - layer0.storage_offset()
    c = p.contract(logical, p.physical(named), origin)
    p.check_view(c, kv_cache, kv_cache.storage_offset() - whole.storage_offset(), p.DIMS)
    obs.update(
        used="yes",
        allocator=f"{MIXIN}.KVConnectorModelRunnerMixin.allocate_uniform_kv_caches",
        whole=p.view_record(whole),
        kv_cache=p.view_record(kv_cache),
        layer_stride=named["L"],
        write=p.observe_write(write, kv_cache, whole, c, path, calls),
    )
    return [c], obs


def _spec() -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(
        block_size=p.DIMS.block_size, num_kv_heads=p.DIMS.kv_heads, head_size=p.DIMS.head_dim, dtype=torch.float32
    )
