"""vLLM 0.29 -: no get_kv_cache_shape. vllm/v1/kv_cache_layout.py's KVCacheLayout enum names each physical order
of the logical [L, B, H, N, C] allocation (C = 2*head_dim bytes-worth: K then V), and
kv_cache_interface.create_kv_cache_views cuts the per-layer [B, H, N, C] views out of one flat buffer.
VLLM_KV_CACHE_LAYOUT picks a member among those the backend accepts (`supported_kv_cache_layouts()`, None: all;
FlashInfer answers per device class, so it is asked once per class of surface.DEVICE_CLASSES). A backend's spec is
its `customize_spec` of an attention spec of the cache dtype; every member is read with one layer and with
DIMS.num_layers sharing a buffer; the write goes through the impl's do_kv_cache_update.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator
from typing import Any

import torch

from harness.backends import Backend
from harness.contract import Contract, Dims
from harness.probe import era_write, write
from harness.probe.imports import device, module
from harness.probe.observe import DIMS, ProbeError, axes, check_view, contract, dims, element, physical, view_record
from harness.vllm_api.surface import DEVICE_CLASSES

LAYOUT = "vllm.v1.kv_cache_layout"
IFACE = "vllm.v1.kv_cache_interface"


def missing() -> str | None:
    layout = module(LAYOUT)
    if layout is None or not hasattr(layout, "KVCacheLayout"):
        return f"no {LAYOUT}.KVCacheLayout"
    iface = module(IFACE)
    for name in ("create_kv_cache_views", "compute_layout_strides", "KVCacheTensor", "FullAttentionSpec"):
        if not hasattr(iface, name):
            return f"{IFACE} has no {name}"
    return era_write.write_method_missing()


def facts() -> dict[str, Any]:
    return {"era": "era_enum", "method": "KVCacheLayout + create_kv_cache_views + "
            "FlashAttentionImpl.do_kv_cache_update write", "layouts": [m.name for m in module(LAYOUT).KVCacheLayout]}


def views(version: str, b: Backend, cls: type, cache_dtype: str,
          mod: types.ModuleType) -> Iterator[tuple[str, list[Contract], dict[str, Any]]]:
    """(setting, [contract], record) per KVCacheLayout member the backend accepts on some device class, one layer
    and DIMS.num_layers layers in one buffer."""
    iface = module(IFACE)
    allowed: dict[Any, list[str]] = {}
    for cap in DEVICE_CLASSES:
        with device(mod, cap):
            supported = cls.supported_kv_cache_layouts()
        for member in list(module(LAYOUT).KVCacheLayout) if supported is None else list(supported):
            allowed.setdefault(member, []).append(f"sm{cap[0]}{cap[1]}")
    for member, classes in allowed.items():
        for count, what in ((1, "single-layer"), (DIMS.num_layers, "cross-layer")):
            d = dims(b, count)
            spec = _spec(iface, b, cls, cache_dtype, d)
            strides = iface.compute_layout_strides(spec, d.num_blocks, d.num_layers, member)
            tensor = iface.KVCacheTensor(size=spec.page_size_bytes * d.num_blocks * d.num_layers,
                                         layers=[f"layers.{i}" for i in range(d.num_layers)],
                                         layer_stride=strides[0], block_stride=strides[1])
            raw = torch.empty(tensor.size, dtype=torch.int8)
            made = iface.create_kv_cache_views(raw, spec, d.num_blocks, member, tensor)
            kv_cache = made[d.layer]
            logical = axes(b, cache_dtype, tuple(kv_cache.shape), "create_kv_cache_views")
            named = {a: s for a, s, n in zip(logical, kv_cache.stride(), kv_cache.shape) if n > 1}
            if count > 1:
                named["L"] = made[1].storage_offset() - made[0].storage_offset()
            phys = _physical(logical, named, member, count)
            only = "" if len(classes) == len(DEVICE_CLASSES) else f" ({', '.join(classes)})"
            setting = f"{member.name} {what}{only}"
            c = contract(b, logical, phys, f"vllm {version} {b.name} {setting}", cache_dtype)
            check_view(c, kv_cache, kv_cache.storage_offset(), d)
            yield setting, [c], {
                "stride_order": list(member.stride_order), "device_classes": classes,
                "spec": {"num_heads": spec.num_heads, "state_content_size_bytes": spec.state_content_size_bytes,
                         "dtype": str(spec.dtype)},
                "kv_cache": view_record(kv_cache),
                "write": write.observed(write.METHOD, b, cls, mod, c, kv_cache, raw.view(kv_cache.dtype))}


def _spec(iface, b: Backend, cls: type, cache_dtype: str, d: Dims):
    fields = {f.name for f in dataclasses.fields(iface.FullAttentionSpec)}
    kw: dict[str, Any] = dict(block_size=d.block_size, num_kv_heads=d.kv_heads, head_size=d.head_dim,
                              dtype=element(cache_dtype))
    if "kv_quant_mode" in fields:
        kw["kv_quant_mode"] = iface.get_kv_quant_mode(cache_dtype)
    if b.latent:
        kw["cache_dtype_str"] = cache_dtype
        spec = iface.MLAAttentionSpec(**kw)
    else:
        if b.diff_kv:
            kw["head_size_v"] = d.v_dim
        spec = iface.FullAttentionSpec(**kw)
    customize = getattr(cls, "customize_spec", None)
    return customize(spec) if customize is not None else spec


def _physical(logical, named: dict[str, int], member, count: int) -> tuple[str, ...]:
    # A size-1 axis (a latent cache's one head slot) has no telling stride: the layout member places it.
    heads = "S" if "S" in logical else "H"
    enum_axes = ("L", "B", heads, "N", logical[-1])
    declared = tuple(enum_axes[i] for i in member.stride_order if count > 1 or enum_axes[i] != "L")
    phys = physical(named)
    if tuple(a for a in declared if a in named) != phys:
        raise ProbeError(f"{member} declares physical order {'.'.join(declared)} but create_kv_cache_views "
                         f"built {'.'.join(phys)} (strides {named})")
    return declared
