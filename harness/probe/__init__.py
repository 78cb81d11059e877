"""Read the installed vLLM release's KV-cache contract from the release's own code.

One adapter module per era of vLLM's API (how a release can be asked about its layout):

| module | releases | asks the release |
|---|---|---|
| `era_shape` | 0.8.5 | FlashAttentionBackend.get_kv_cache_shape; write at the start of FlashAttentionImpl.forward |
| `era_stride` | 0.9 - 0.14 | + get_kv_cache_stride_order (NHD/HND), from 0.12 with include_num_layers_dimension and the connector's cross-layer allocator; write at the start of forward |
| `era_write` | 0.15 - 0.28 | same, write through FlashAttentionImpl.do_kv_cache_update |
| `era_enum` | 0.29 - | vllm.v1.kv_cache_layout.KVCacheLayout + create_kv_cache_views (no shape method); do_kv_cache_update |

The era adapters read FLASH_ATTN at the model dtype; `backends` then reads every other attention backend and
cache dtype the release has (FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, FLASH_ATTN_DIFFKV, TRITON_MLA, and FLASH_ATTN
in fp8) with the same API, and its docstring says how to add a backend.

Every adapter instantiates the release's layout at observe.DIMS (all sizes distinct, so each axis is named by its
size and never guessed), names the physical order from the strides of the tensor the release builds, and runs the
release's own cache-write path on the CPU with vLLM's CUDA op `reshape_and_cache_flash` replaced by
`observe.scatter` (same semantics) to see where K and V land. Anything an adapter cannot read raises ProbeError
naming what was missing.
"""

from __future__ import annotations

import importlib.metadata

from harness.fixtures import Recording
from harness.probe import api, backends, era_enum, era_shape, era_stride, era_write
from harness.probe.observe import ProbeError

__all__ = ["ERAS", "ProbeError", "probe", "release"]

ERAS = (era_enum, era_write, era_stride, era_shape)  # newest first: the first that matches probes


def release() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise ProbeError("vllm is not installed in this environment") from None


def probe() -> Recording:
    """The installed release's contracts, read by the newest adapter whose API the release has."""
    version = release()
    missing = []
    for era in ERAS:
        gap = era.missing()
        if gap is None:
            enum_era = era is era_enum
            rec = era.probe(version)
            more, observed = backends.read(version, enum_era=enum_era)
            return Recording(rec.release, rec.contracts + tuple(more), {**rec.observations, "backends": observed},
                             api.record(enum_era=enum_era))
        missing.append(f"{era.__name__.rpartition('.')[2]}: {gap}")
    raise ProbeError(f"vllm {version}: no adapter understands this release's API; " + "; ".join(missing))
