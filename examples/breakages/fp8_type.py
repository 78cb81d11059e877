"""A coverage case, no public breakage: a consumer that views every fp8 cache as e4m3 (`float8_e4m3fn`, what vLLM's
`fp8` means on CUDA), ignoring layer.cache_dtype. An fp8_e5m2 cache has the same bytes per element, so every shape
and stride agrees, and each value is read with the wrong exponent and mantissa widths."""

from __future__ import annotations

import torch

from offloader import Offloader


class AlwaysE4m3(Offloader):
    """The views the backend states, retyped to float8_e4m3fn wherever the cache dtype is one of fp8's."""

    name = "fp8-always-e4m3"

    def fp8(self, layer):
        return torch.float8_e4m3fn

    def split(self, kv_cache, layer):
        k, v = super().split(kv_cache, layer)
        if not layer.cache_dtype.startswith("fp8"):
            return k, v
        return k.view(self.fp8(layer)), v.view(self.fp8(layer))


class ByCacheDtype(AlwaysE4m3):
    """The fp8 type the layer's cache dtype names: e5m2 for fp8_e5m2, e4m3 for the others."""

    name = "fp8-by-cache-dtype"

    def fp8(self, layer):
        return torch.float8_e5m2 if layer.cache_dtype == "fp8_e5m2" else torch.float8_e4m3fn
