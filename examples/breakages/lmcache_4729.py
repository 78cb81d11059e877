"""A connector's layout hint when vLLM removed get_kv_cache_layout() (LMCache #4729): the hint was read in a
try/except that returned None once the function was gone (vLLM 0.29, where the layout became a KVCacheLayout), the
reader then took NHD, and an HND cache was read with the wrong offsets, silently."""

from __future__ import annotations

from offloader import Offloader, asked_axes
from .believed import believed_views, heads_placed, refuse_rank


def hint() -> str | None:
    """What vllm.v1.attention.backends.utils.get_kv_cache_layout() answers, None where it cannot."""
    try:
        from vllm.v1.attention.backends.utils import get_kv_cache_layout

        return get_kv_cache_layout()
    except Exception:  # noqa: BLE001 - as the connector did: any failure is "no hint"
        return None


class LayoutHint(Offloader):
    """Addresses the cache as contiguous in the order the hint names (NHD when there is none)."""

    name = "lmcache-4729-layout-hint"

    def split(self, kv_cache, layer):
        axes = asked_axes(layer)
        refuse_rank(kv_cache, axes)
        return believed_views(kv_cache, layer, axes, heads_placed(axes, (hint() or "NHD") == "HND"))


class StatedLayout(Offloader):
    """The fix: the layout read from what the release states for the layer (its stride order, or the KVCacheLayout
    in force), with the tensor's own strides."""

    name = "lmcache-4729-stated-layout"
