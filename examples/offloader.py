"""KV-cache consumers as kvconform subjects, each deciding the layout the way a family of real consumers does. They
import nothing from kvconform: they read the layer value (release, backend class, sizes, cache dtype string, the
layout setting in force) and vLLM's own API, as they would inside vLLM.

- `Offloader` asks the backend: `get_kv_cache_shape` at sentinel sizes, varying one size per call, names every axis
  (the block axis is the one that follows num_blocks, K/V the one of size 2 that follows nothing); where the release
  has no `get_kv_cache_shape` (the KVCacheLayout releases) it reads the layer's view as [B, H, N, C], as the enum's
  docstring states for model-dtype caches, and an nvfp4 cache as [B, 2H, N, D], K's heads then V's, as FlashInfer's
  NVFP4 spec allocates it. C holds K's stored row (layer.head_size values, then an inline scale where the cache
  dtype keeps one), then V's (layer.head_size_v values: a diff-KV backend's V may be narrower or wider than K).
- `BlocksFirstConnector` calls `get_kv_cache_shape` once at num_blocks 1: a first axis of 1 is blocks-first
  [B, 2, N, H, D], anything else kv-first [2, B, N, H, D].
- `ShapeSniffingReader` asks nothing: a first axis of size 2 is kv-first, 4 axes are packed [B, H, N, 2D].

    cd examples && python -m pytest --pyargs kvconform.suites --kvconform-subject offloader:BlocksFirstConnector \\
        --kvconform-release recorded -k "split or transfer or malformed"
"""

from __future__ import annotations

import inspect

import torch

SENTINEL_BLOCKS = 1234  # vLLM's CPU offloading handler asked with this num_blocks


class Offloader:
    """Moves blocks to host memory and back through K and V views it finds by asking the layer's backend."""

    name = "example-offloader"
    capabilities = frozenset({"split", "transfer"})

    def split(self, kv_cache, layer):
        axes = asked_axes(layer)
        if not fits(kv_cache, layer, axes):
            raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)} strides {tuple(kv_cache.stride())} is not a "
                             f"{'.'.join(axes)} cache of {layer.backend.get_name()} in vLLM {layer.release} "
                             f"(layout {layer.kv_cache_layout or 'default'})")
        return views(kv_cache, layer, axes)

    def extract(self, kv_cache, layer, block_ids):
        k, v = self.split(kv_cache, layer)
        # Indexing by a tensor of block ids copies: the blocks are reused after this. K and V apart: on a diff-KV
        # cache they have their own widths.
        return k[block_ids].to("cpu"), v[block_ids].to("cpu")

    def inject(self, kv_cache, layer, block_ids, payload):
        k, v = self.split(kv_cache, layer)
        k[block_ids] = payload[0].to(kv_cache.device)
        v[block_ids] = payload[1].to(kv_cache.device)


def views(kv_cache, layer, axes):
    """K and V [B, N, H, D] of a cache whose axes are named `axes`, in the cache's view type; packed, K is C up to
    K's stored width."""
    kv_cache = typed(kv_cache, layer)
    if "KV" in axes:
        t = kv_cache.permute([axes.index(a) for a in ("KV", "B", "N", "H", "D")])
        return t[0], t[1]
    if "S" in axes:  # two head slots per head: K's heads, then V's
        t = kv_cache.permute([axes.index(a) for a in ("B", "N", "S", "D")])
        return t[:, :, : layer.num_kv_heads], t[:, :, layer.num_kv_heads:]
    t = kv_cache.permute([axes.index(a) for a in ("B", "N", "H", "C")])
    k = width(layer, layer.head_size)
    return t[..., :k], t[..., k:]


def width(layer, head_size):
    """Elements one side of a token and head takes in the cache: its values, then in a per-token-head fp8 cache its
    fp32 scale (4 fp8 elements)."""
    return head_size + 4 if layer.cache_dtype == "fp8_per_token_head" else head_size


def typed(kv_cache, layer):
    """vLLM allocates fp8 caches as bytes and reads them as fp8."""
    if layer.cache_dtype.startswith("fp8"):
        return kv_cache.view(torch.float8_e5m2 if "e5m2" in layer.cache_dtype else torch.float8_e4m3fn)
    return kv_cache


def ask(layer, num_blocks, block_size, heads, head_size):
    fn = layer.backend.get_kv_cache_shape
    args = (num_blocks, block_size, heads, head_size)
    if "cache_dtype_str" in inspect.signature(fn).parameters:
        return tuple(fn(*args, cache_dtype_str=layer.cache_dtype))
    return tuple(fn(*args))


def asked_axes(layer) -> tuple[str, ...]:
    """Axis names of the layer's kv_cache: B, N, H (or S, two slots per head), D (or C, K and V side by side), KV."""
    if not hasattr(layer.backend, "get_kv_cache_shape"):
        return ("B", "S", "N", "D") if layer.cache_dtype == "nvfp4" else ("B", "H", "N", "C")
    bs, h, d = layer.block_size, layer.num_kv_heads, layer.head_size
    base = ask(layer, SENTINEL_BLOCKS, bs, h, d)
    moved = {"B": ask(layer, SENTINEL_BLOCKS + 1, bs, h, d), "N": ask(layer, SENTINEL_BLOCKS, 2 * bs, h, d),
             "H": ask(layer, SENTINEL_BLOCKS, bs, h + 1, d), "D": ask(layer, SENTINEL_BLOCKS, bs, h, 2 * d)}
    names = []
    for i, size in enumerate(base):
        changed = [a for a, other in moved.items() if other[i] != size]
        if not changed and size == 2:
            names.append("KV")
        elif changed == ["H"] and moved["H"][i] - size == 2:
            names.append("S")
        elif len(changed) == 1:
            names.append(changed[0])
        else:
            raise ValueError(f"{layer.backend.get_name()}.get_kv_cache_shape answers {base}: cannot name its axes")
    if "KV" not in names and "S" not in names:
        names[names.index("D")] = "C"
    return tuple(names)


def fits(kv_cache, layer, axes) -> bool:
    """The tensor is the cache the backend describes: its shape, innermost stride 1, axes in the stated order."""
    if kv_cache.dim() != len(axes) or kv_cache.stride()[-1] != 1:
        return False
    if hasattr(layer.backend, "get_kv_cache_shape"):
        want = ask(layer, kv_cache.shape[axes.index("B")], layer.block_size, layer.num_kv_heads, layer.head_size)
        if tuple(kv_cache.shape) != want:
            return False
    elif "S" in axes:
        if (kv_cache.shape[1], kv_cache.shape[2]) != (2 * layer.num_kv_heads, layer.block_size):
            return False
    elif (kv_cache.shape[1], kv_cache.shape[2], kv_cache.shape[3]) != (
            layer.num_kv_heads, layer.block_size, width(layer, layer.head_size) + width(layer, layer.head_size_v)):
        return False
    order = stated_order(layer, axes)
    long = [a for a, n in zip(axes, kv_cache.shape) if n > 1]
    by_stride = sorted(long, key=lambda a: -kv_cache.stride()[axes.index(a)])
    return order is None or by_stride == [a for a in order if a in long]


def stated_order(layer, axes):
    """The axes outermost first as the release states them, None where it states no order."""
    if not hasattr(layer.backend, "get_kv_cache_shape"):
        from vllm.v1.kv_cache_layout import KVCacheLayout

        spelled = ("L", "B", "S", "N", "D") if "S" in axes else ("L", "B", "H", "N", "C")
        return [spelled[i] for i in KVCacheLayout[layer.kv_cache_layout].stride_order if i]
    fn = getattr(layer.backend, "get_kv_cache_stride_order", None)
    if fn is None:
        return None
    try:
        order = fn(include_num_layers_dimension=True) if layer.cross_layer else fn()
    except NotImplementedError:
        return None
    spelled = ("L", *axes) if layer.cross_layer else axes
    return [spelled[i] for i in order if spelled[i] != "L"]


class BlocksFirstConnector(Offloader):
    """Decides blocks-first from one answer, as connectors did: `get_kv_cache_shape(1, ...)[0] == 1`."""

    name = "example-blocks-first-connector"

    def split(self, kv_cache, layer):
        first = ask(layer, 1, layer.block_size, layer.num_kv_heads, layer.head_size)[0]
        if kv_cache.dim() != 5:
            raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)}: expected 5 axes")
        kv_cache = typed(kv_cache, layer)
        return (kv_cache[:, 0], kv_cache[:, 1]) if first == 1 else (kv_cache[0], kv_cache[1])


class ShapeSniffingReader(Offloader):
    """Reads the layout off the tensor: a first axis of 2 is kv-first, 4 axes are packed."""

    name = "example-shape-sniffing-reader"

    def split(self, kv_cache, layer):
        kv_cache = typed(kv_cache, layer)
        if kv_cache.dim() == 4:  # [B, H, N, 2D]
            half = kv_cache.shape[-1] // 2
            return kv_cache[..., :half].transpose(1, 2), kv_cache[..., half:].transpose(1, 2)
        if kv_cache.dim() != 5:
            raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)}: expected 4 or 5 axes")
        return (kv_cache[0], kv_cache[1]) if kv_cache.shape[0] == 2 else (kv_cache[:, 0], kv_cache[:, 1])
