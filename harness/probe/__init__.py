"""Read the installed vLLM release's KV-cache contracts from the release's own code.

One reader per era of vLLM's API (how a release can be asked about its layout), chosen once per release:

| module | releases | asks each backend |
|---|---|---|
| `era_shape` | 0.8.5 | get_kv_cache_shape; write at the start of the impl's forward |
| `era_stride` | 0.9 - 0.14 | + get_kv_cache_stride_order (NHD/HND), from 0.12 with include_num_layers_dimension and the connector's cross-layer allocator; write at the start of forward |
| `era_write` | 0.15 - 0.28 | same, write through the impl's do_kv_cache_update |
| `era_enum` | 0.29 - | vllm.v1.kv_cache_layout.KVCacheLayout + customize_spec + create_kv_cache_views (no shape method); do_kv_cache_update |

Each reader reads every backend of harness.backends.BACKENDS at every cache dtype of DTYPES the backend lists
in its `supported_kv_cache_dtypes` (before that attribute existed: the model dtype only). One home each: `imports`
imports the release's modules (a GPU library stubbed where it does not import here, the device class stubbed where a
backend asks it), `observe` names axes at its fixed sizes (all distinct, so each axis is named by its size and never
guessed) and checks the tensor the release built against the contract read, `write` runs the backend's own cache
write on the CPU to see where K and V land. Anything a reader cannot read raises ProbeError naming what was missing;
a backend that cannot be imported or read is kept in the recording with why.

One level up, `allocation` runs the release's own planner and allocator over a few whole models (MODELS: uniform,
kernel blocks inside manager blocks, sliding-window and Mamba groups overlaid, padded pages, shared layers, MLA with
its indexer, layers interleaved per block) and records what each layer and the KV connector are handed, or what the
release refused.

Adding a backend: add its line to harness.backends.BACKENDS and its cache dtypes to DTYPES. If its kv_cache
splits K and V in a way no family of harness.contract expresses, add the family there first (FAMILIES, `split`, `size`);
until then the probe rejects it by name.
"""

from __future__ import annotations

import importlib.metadata
import types
from typing import Any

from harness.backends import BACKENDS, Backend
from harness.contract import ALIASES, Contract
from harness.probe import allocation, api, era_enum, era_shape, era_stride, era_write
from harness.probe.imports import NotImportable, backend
from harness.probe.observe import DIMS, SLOTS, ProbeError, dedupe
from harness.recordings.store import Recording

__all__ = ["DTYPES", "ERAS", "ProbeError", "probe", "release"]

ERAS = (era_enum, era_write, era_stride, era_shape)  # newest first: the first that matches reads the release

DTYPES = {  # the cache dtypes asked about per backend, where it lists them
    "FLASH_ATTN": ("auto", "fp8_e4m3"),
    "FLASHINFER": ("auto", "fp8_e4m3", "fp8_e5m2", "nvfp4"),
    "TRITON_ATTN": ("auto", "fp8_e4m3", "fp8_e5m2", "fp8_per_token_head"),
    "FLEX_ATTENTION": ("auto",),
    "FLASH_ATTN_DIFFKV": ("auto", "fp8_e4m3"),
    "TRITON_MLA": ("auto", "fp8_e4m3"),
}


def release() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise ProbeError("vllm is not installed in this environment") from None


def era() -> types.ModuleType:
    """The reader of the installed release: the newest whose API the release has."""
    missing = []
    for e in ERAS:
        gap = e.missing()
        if gap is None:
            return e
        missing.append(f"{e.__name__.rpartition('.')[2]}: {gap}")
    raise ProbeError(f"vllm {release()}: no reader understands this release's API; " + "; ".join(missing))


def probe() -> Recording:
    """The installed release's contracts, every backend and cache dtype, with what was asked and answered."""
    version, reader = release(), era()
    observations: dict[str, Any] = {**reader.facts(), "dims": vars(DIMS), "slots": list(SLOTS), "backends": {}}
    contracts: list[Contract] = []
    for b in BACKENDS:
        found, observations["backends"][b.name] = _backend(version, reader, b)
        contracts += found
    observations["allocations"] = allocation.allocations()
    return Recording(version, tuple(contracts), observations, api.record())


def _backend(version: str, reader: types.ModuleType, b: Backend) -> tuple[tuple[Contract, ...], dict[str, Any]]:
    """A backend's contracts and what was asked and answered, or why it was not read: ProbeError where the release
    contradicts its own declarations (no contract of it stands)."""
    try:
        with backend(b) as (mod, cls, stubbed):
            if cls is None:
                return (), {"present": False, "why": f"no {b.path}.{b.cls} in this release"}
            found, settings = [], {}
            for name in _dtypes(b, cls):
                try:
                    for setting, cs, record in reader.views(version, b, cls, name, mod):
                        found += cs
                        settings[f"{name} {setting}"] = record
                except ProbeError as e:
                    raise ProbeError(f"vllm {version} {b.name} {name}: {e}") from e
                except Exception as e:  # noqa: BLE001 - kept in the recording, named; the other backends still stand
                    return (), {"present": True, "read": False, "why": f"{type(e).__name__}: {e}"}
    except NotImportable as e:  # the drift check names it; the other backends are read
        return (), {"present": True, "read": False, "why": f"not importable: {e}"}
    return dedupe(found), {
        "present": True, "read": True, "class": f"{b.path}.{b.cls}", "settings": settings,
        **({"gpu_library_stubbed": f"{stubbed} is not installed with this release: its module was imported with "
            f"{stubbed} stubbed, the contracts read from the backend's own Python declarations"} if stubbed else {}),
        "supported_kv_cache_dtypes": _declared(cls)}


def _declared(cls: type) -> list[str] | None:
    """The backend's `supported_kv_cache_dtypes` (None: the release has no such attribute)."""
    declared = getattr(cls, "supported_kv_cache_dtypes", None)
    return None if declared is None else list(declared)


def _dtypes(b: Backend, cls: type) -> list[str]:
    declared = _declared(cls)
    if declared is None:
        return ["auto"] if "auto" in DTYPES[b.name] else []
    said = {ALIASES.get(d, d) for d in declared}
    return [d for d in DTYPES[b.name] if d == "auto" or d in said]
