"""vLLM 0.29 -: no get_kv_cache_shape. vllm/v1/kv_cache_layout.py's KVCacheLayout enum names each physical
order of the logical [L, B, H, N, C] allocation (C = 2*head_dim bytes-worth: K then V), and
kv_cache_interface.create_kv_cache_views cuts the per-layer [B, H, N, C] views out of one flat buffer.
VLLM_KV_CACHE_LAYOUT picks a member among those the backend accepts (FLASH_ATTN's supported_kv_cache_layouts()
returns None: all of them). Every member is probed with one layer and with DIMS.num_layers sharing a buffer;
the write goes through FlashAttentionImpl.do_kv_cache_update.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.probe import observe as p
from harness.contract import Dims
from harness.fixtures import Recording
from harness.probe import era_write
from harness.probe.era_stride import FA, SINGLE

LAYOUT = "vllm.v1.kv_cache_layout"
IFACE = "vllm.v1.kv_cache_interface"
ENUM_AXES = ("L", "B", "H", "N", "C")  # the enum's logical axis order (its module docstring and _DIM_* constants)


def missing() -> str | None:
    layout = p.module(LAYOUT)
    if layout is None or not hasattr(layout, "KVCacheLayout"):
        return f"no {LAYOUT}.KVCacheLayout"
    iface = p.module(IFACE)
    for name in ("create_kv_cache_views", "compute_layout_strides", "KVCacheTensor", "FullAttentionSpec"):
        if not hasattr(iface, name):
            return f"{IFACE} has no {name}"
    fa = p.module(FA)
    if fa is None or not hasattr(fa, "FlashAttentionImpl"):
        return f"no {FA}.FlashAttentionImpl"
    if "do_kv_cache_update" not in vars(fa.FlashAttentionImpl):
        return "FlashAttentionImpl has no do_kv_cache_update"
    return None


def probe(version: str) -> Recording:
    fa = p.module(FA)
    layouts = p.module(LAYOUT).KVCacheLayout
    be = fa.FlashAttentionBackend
    supported = be.supported_kv_cache_layouts()
    members = list(layouts) if supported is None else list(supported)
    path, write = era_write.method_write(fa)
    calls: list = []
    contracts, settings = [], {}
    with p.patched(fa, "reshape_and_cache_flash", p.scatter(calls, stop=False)):
        for member in members:
            for dims, what in ((SINGLE, "single-layer"), (p.DIMS, "cross-layer")):
                c, obs = _layout(member, dims, f"vllm {version} {be.get_name()} {member.name} {what}", path, write, calls)
                contracts.append(c)
                settings[f"{member.name} {what}"] = obs
    observations = {
        "era": "era_enum",
        "method": "KVCacheLayout + create_kv_cache_views + FlashAttentionImpl.do_kv_cache_update write",
        "dims": vars(p.DIMS),
        "slots": list(p.SLOTS),
        "layouts": [m.name for m in layouts],
        "supported_kv_cache_layouts": None if supported is None else [m.name for m in supported],
        "settings": settings,
    }
    return Recording(version, p.dedupe(contracts), observations)


def _layout(member, dims: Dims, origin: str, path: str, write, calls) -> tuple[Any, dict]:
    iface = p.module(IFACE)
    spec = iface.FullAttentionSpec(
        block_size=dims.block_size, num_kv_heads=dims.kv_heads, head_size=dims.head_dim, dtype=torch.float32
    )
    strides = iface.compute_layout_strides(spec, dims.num_blocks, dims.num_layers, member)
    names = [f"layers.{i}" for i in range(dims.num_layers)]
    size = spec.page_size_bytes * dims.num_blocks * dims.num_layers
    tensor = iface.KVCacheTensor(size=size, layers=names, layer_stride=strides[0], block_stride=strides[1])
    raw = torch.empty(size, dtype=torch.int8)
    views = iface.create_kv_cache_views(raw, spec, dims.num_blocks, member, tensor)
    kv_cache = views[dims.layer]
    logical = p.axes(tuple(kv_cache.shape), "create_kv_cache_views")
    named = dict(zip(logical, kv_cache.stride()))
    if dims.num_layers > 1:
        named["L"] = views[1].storage_offset() - views[0].storage_offset()
    phys = p.physical(named)
    declared = tuple(ENUM_AXES[i] for i in member.stride_order if dims.num_layers > 1 or ENUM_AXES[i] != "L")
    if phys != declared:
        raise p.ProbeError(
            f"{member} declares physical order {'.'.join(declared)} but create_kv_cache_views built "
            f"{'.'.join(phys)} (shape {tuple(kv_cache.shape)}, strides {kv_cache.stride()})"
        )
    c = p.contract(logical, phys, origin)
    p.check_view(c, kv_cache, kv_cache.storage_offset(), dims)
    obs = {
        "stride_order": list(member.stride_order),
        "layer_stride_bytes": strides[0],
        "block_stride_bytes": strides[1],
        "kv_cache": p.view_record(kv_cache),
        "write": p.observe_write(write, kv_cache, raw.view(torch.float32), c, path, calls),
    }
    return c, obs
