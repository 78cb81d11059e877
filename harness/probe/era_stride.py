"""vLLM 0.9 - 0.14: a backend's get_kv_cache_shape + get_kv_cache_stride_order, switched NHD/HND by
VLLM_KV_CACHE_LAYOUT (read through a functools.lru_cache); from 0.12 the stride order also answers
include_num_layers_dimension=True and the KV-connector mixin allocates one cross-layer tensor. The cache write is
the first thing an impl's forward does; the scatter stops forward right after it.

`views` reads every backend of the shape-method eras (era_shape: no stride order; era_write: the write method).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import types
from collections.abc import Iterator
from typing import Any

import torch

from harness.backends import LAYOUT_ENV, LAYOUT_VALUES, Backend, layout_env
from harness.contract import CACHE_DTYPES, Contract
from harness.probe import write
from harness.probe.imports import module
from harness.probe.observe import (
    DIMS,
    MODEL_DTYPE,
    ProbeError,
    axes,
    check_view,
    contract,
    dims,
    element,
    patched,
    physical,
    view_record,
)

FA = "vllm.v1.attention.backends.flash_attn"
MIXIN = "vllm.v1.worker.kv_connector_model_runner_mixin"
# The attention a model gets unless told otherwise (FLASH_ATTN at the model's dtype): the KV connector's cross-layer
# allocation is read for it.
MODEL = ("FLASH_ATTN", "auto")
WRITE = write.FORWARD


def backend() -> tuple[types.ModuleType | None, Any]:
    """(flash_attn module, FlashAttentionBackend), or (None, what is missing)."""
    fa = module(FA)
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


def facts() -> dict[str, Any]:
    return {"era": "era_stride", "method": "get_kv_cache_shape + get_kv_cache_stride_order + "
            "FlashAttentionImpl.forward write", **switch()}


def switch() -> dict[str, str]:
    """The release's answer to a VLLM_KV_CACHE_LAYOUT value it does not document (through FLASH_ATTN's stride
    order); ProbeError when it accepts one."""
    _, be = backend()
    with layout_env("XYZ"):
        try:
            be.get_kv_cache_stride_order()
        except Exception as e:  # noqa: BLE001 - any refusal will do; its text goes into the record
            return {"rejects": f"{LAYOUT_ENV}=XYZ -> {type(e).__name__}: {e}"}
    raise ProbeError(f"{LAYOUT_ENV}=XYZ is accepted: the switch values are not NHD/HND only")


def takes_cache_dtype(cls: type) -> bool:
    """Whether the backend's get_kv_cache_shape takes `cache_dtype_str`."""
    return "cache_dtype_str" in inspect.signature(cls.get_kv_cache_shape).parameters


def asked_shape(b: Backend, cls: type, cache_dtype: str) -> tuple[int, ...]:
    """`cls.get_kv_cache_shape` at the backend's probe sizes (each axis size distinct, so `axes` names them)."""
    d = dims(b)
    args = (d.num_blocks, d.block_size, d.kv_heads, d.head_dim)
    # The diff-KV backends keep V's head dim as class state (`head_size_v`), set by the model.
    with patched(cls, "head_size_v", d.v_dim) if b.diff_kv else contextlib.nullcontext():
        if takes_cache_dtype(cls):
            return tuple(cls.get_kv_cache_shape(*args, cache_dtype_str=cache_dtype))
        return tuple(cls.get_kv_cache_shape(*args))


def views(version: str, b: Backend, cls: type, cache_dtype: str, mod: types.ModuleType,
          path: str = WRITE) -> Iterator[tuple[str, list[Contract], dict[str, Any]]]:
    """(setting, contracts, record) per VLLM_KV_CACHE_LAYOUT value the backend's stride order answers ("default"
    where it has none): the cache allocated in stride order and permuted back to the logical shape, as
    GPUModelRunner._reshape_kv_cache_tensors does, its write observed through `path`; for MODEL, the KV connector's
    cross-layer allocation under the same value too."""
    takes_dtype = takes_cache_dtype(cls)
    if not takes_dtype and not CACHE_DTYPES[cache_dtype].values_only:
        return
    shape = asked_shape(b, cls, cache_dtype)
    logical = axes(b, cache_dtype, shape, "get_kv_cache_shape")
    orders: dict[str | None, tuple[int, ...]] = {None: tuple(range(len(shape)))}
    stride_fn = getattr(cls, "get_kv_cache_stride_order", None)
    if stride_fn is not None:
        try:
            orders = {}
            for value in LAYOUT_VALUES:
                with layout_env(value):
                    orders[value] = tuple(stride_fn())
        except NotImplementedError:
            orders = {None: tuple(range(len(shape)))}
    for value, order in orders.items():
        setting = "default" if value is None else f"{LAYOUT_ENV}={value}"
        if sorted(order) != list(range(len(shape))):
            raise ProbeError(f"{b.name}.get_kv_cache_stride_order() returned {order} for shape {shape}")
        buf = torch.empty(math.prod(shape), dtype=element(cache_dtype))
        kv_cache = buf.view([shape[i] for i in order]).permute(*[order.index(i) for i in range(len(order))])
        c = contract(b, logical, physical(dict(zip(logical, kv_cache.stride()))),
                     f"vllm {version} {b.name} {setting}", cache_dtype)
        check_view(c, kv_cache, 0, dims(b, 1))
        with layout_env(value) if value is not None else contextlib.nullcontext():
            record = {"get_kv_cache_shape": list(shape), "cache_dtype_str_argument": takes_dtype,
                      "stride_order": list(order), "kv_cache": view_record(kv_cache),
                      "write": write.observed(path, b, cls, mod, c, kv_cache, buf)}
            found = [c]
            if (b.name, cache_dtype) == MODEL and value is not None and "include_num_layers_dimension" in \
                    inspect.signature(stride_fn).parameters:
                cross, record["cross_layer"] = _cross_layer(version, b, cls, mod, setting, path, shape)
                found += cross
        yield setting, found, record


def _cross_layer(version: str, b: Backend, cls: type, mod: types.ModuleType, setting: str, path: str,
                 shape: tuple[int, ...]) -> tuple[list[Contract], dict[str, Any]]:
    """One allocation for all layers, built by the release's KV-connector allocator when its stride order moves
    the layer axis inward (vLLM only uses the cross-layer tensor then)."""
    order = tuple(cls.get_kv_cache_stride_order(include_num_layers_dimension=True))
    obs: dict[str, Any] = {"stride_order": list(order)}
    if len(order) != len(shape) + 1:
        obs["used"] = f"no: stride order {order} has no layer axis for shape {shape}"
        return [], obs
    if order[0] == 0:
        obs["used"] = "no: layers stay outermost, so vLLM allocates per layer"
        return [], obs
    mixin = module(MIXIN)
    allocate = getattr(getattr(mixin, "KVConnectorModelRunnerMixin", None), "allocate_uniform_kv_caches", None)
    if allocate is None:
        raise ProbeError(f"{MIXIN}.KVConnectorModelRunnerMixin has no allocate_uniform_kv_caches")
    spec = module("vllm.v1.kv_cache_interface").FullAttentionSpec(
        block_size=DIMS.block_size, num_kv_heads=DIMS.kv_heads, head_size=DIMS.head_dim, dtype=MODEL_DTYPE)
    names = [f"layers.{i}" for i in range(DIMS.num_layers)]
    tensors = [types.SimpleNamespace(size=spec.page_size_bytes * DIMS.num_blocks, shared_by=[n]) for n in names]
    config = types.SimpleNamespace(kv_cache_tensors=tensors)
    groups = [[types.SimpleNamespace(kv_cache_spec=spec, backend=cls)]]
    kv_caches, whole, _ = allocate(config, groups, "auto", torch.device("cpu"), [DIMS.block_size])
    layer0, kv_cache = kv_caches[names[0]], kv_caches[names[DIMS.layer]]
    logical = axes(b, "auto", tuple(kv_cache.shape), "allocate_uniform_kv_caches")
    named = dict(zip(logical, kv_cache.stride()))
    named["L"] = kv_cache.storage_offset() - layer0.storage_offset()
    c = contract(b, logical, physical(named), f"vllm {version} {b.name} {setting} cross-layer", "auto")
    check_view(c, kv_cache, kv_cache.storage_offset() - whole.storage_offset(), DIMS)
    obs.update(
        used="yes",
        allocator=f"{MIXIN}.KVConnectorModelRunnerMixin.allocate_uniform_kv_caches",
        whole=view_record(whole),
        kv_cache=view_record(kv_cache),
        layer_stride=named["L"],
        write=write.observed(path, b, cls, mod, c, kv_cache, whole),
    )
    return [c], obs
