"""How the probe observes a release: its fixed sizes (every axis size distinct, so each axis is named by its size
and never guessed), importing the release's modules (a GPU library that does not import here named as such),
naming the axes and the physical order of a tensor the release builds, checking it against the contract read, and
running the release's own cache-write path on the CPU with vLLM's CUDA op replaced by `scatter` (same semantics)
to see where K and V land."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.contract import Contract, ContractError, Dims, views

# num_blocks=3 (not 2, which equals the K/V axis), layers 5: every axis size differs from every other.
DIMS = Dims(num_blocks=3, block_size=16, kv_heads=4, head_dim=32, num_layers=5, layer=1)
SLOTS = (5, 32, 31, 41, 0)  # tokens in every block, at the first and last offsets of a block
GPU_LIBRARIES = ("flashinfer",)  # imported by a backend module, absent from some releases' CPU installs


class ProbeError(ContractError):
    """The installed release's layout cannot be read by any adapter (a `contract-error` outcome)."""


class Written(Exception):
    """Raised by the scatter to stop a forward pass right after its cache write."""


def module(name: str) -> types.ModuleType | None:
    """Import a vLLM module, None when the release has no such module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            return None
        raise ProbeError(f"importing {name} failed: {e}") from e
    except Exception as e:  # noqa: BLE001 - named below
        lib = _gpu_library_in(e)
        if lib is None:
            raise
        # A GPU library installed but broken on this CPU host (a CUDA binding it needs is missing) is, for the
        # probe, one that is not installed: the backend's module is then imported with the library stubbed.
        gone = ModuleNotFoundError(f"{lib} is installed but does not import here: {type(e).__name__}: {e}", name=lib)
        raise ProbeError(f"importing {name} failed: {gone}") from gone


def _gpu_library_in(e: BaseException) -> str | None:
    """The GPU library (GPU_LIBRARIES) whose import raised `e`, if one did."""
    tb = e.__traceback__
    while tb is not None:
        parts = tb.tb_frame.f_code.co_filename.replace("\\", "/").split("/")
        for lib in GPU_LIBRARIES:
            if lib in parts[:-1]:
                return lib
        tb = tb.tb_next
    return None


def axes(shape: tuple[int, ...], what: str, layers: bool = False) -> tuple[str, ...]:
    """Name each axis of a shape the release built at DIMS by its size (all sizes differ, so this is exact)."""
    names = {DIMS.size(a): a for a in ("B", "KV", "N", "H", "D", "C")}
    if layers:
        names[DIMS.num_layers] = "L"
    out = tuple(names.get(s, "?") for s in shape)
    if "?" in out or len(set(out)) != len(out):
        raise ProbeError(f"{what} returned shape {tuple(shape)} at {DIMS}: sizes do not name known axes")
    return out


def physical(named: dict[str, int]) -> tuple[str, ...]:
    """Axes ordered outermost first by their strides (sizes all exceed 1, so strides are strictly ordered)."""
    return tuple(sorted(named, key=lambda a: -named[a]))


def contract(logical: tuple[str, ...], phys: tuple[str, ...], origin: str) -> Contract:
    try:
        return Contract.of(logical, phys, origin)
    except ContractError as e:
        raise ProbeError(str(e)) from None


def check_view(c: Contract, kv_cache: torch.Tensor, layer_offset: int, dims: Dims) -> None:
    """The tensor the release hands a layer must have exactly the contract's geometry at `dims`."""
    want = views.geometry(c, dims, kv_cache.dtype).kv_cache
    got = (tuple(kv_cache.shape), tuple(kv_cache.stride()), layer_offset)
    if got != (want.shape, want.stride, want.offset):
        raise ProbeError(
            f"release built kv_cache shape {got[0]} strides {got[1]} offset {got[2]}, but {c.describe()} "
            f"gives shape {want.shape} strides {want.stride} offset {want.offset} at {dims}"
        )


def view_record(t: torch.Tensor, offset: int | None = None) -> dict[str, Any]:
    return {"shape": list(t.shape), "stride": list(t.stride()), "offset": t.storage_offset() if offset is None else offset}


def scatter(calls: list, stop: bool) -> Callable[..., None]:
    """Python stand-in for vLLM's CUDA `reshape_and_cache_flash`: token i goes to slot slot_mapping[i] of the
    [num_blocks, block_size, kv_heads, head_dim] K and V caches (negative slots skipped), strides honoured."""

    def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, *args, **kwargs):
        calls.append({"key_cache": view_record(key_cache), "value_cache": view_record(value_cache)})
        block_size = key_cache.shape[1]
        for i, slot in enumerate(slot_mapping.tolist()):
            if slot >= 0:
                key_cache[slot // block_size, slot % block_size] = key[i]
                value_cache[slot // block_size, slot % block_size] = value[i]
        if stop:
            raise Written

    return reshape_and_cache_flash


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def write_ops(module: types.ModuleType, op: Callable, names: tuple[str, ...] = ("reshape_and_cache_flash",)
              ) -> Iterator[None]:
    """`op` in place of the release's cache-write ops: `module`'s names among `names` (reshape_and_cache_flash even
    where absent: FLASH_ATTN imports it only with CUDA) and torch.ops._C_cache_ops.reshape_and_cache_flash."""
    with contextlib.ExitStack() as stack:
        for name in names:
            if hasattr(module, name) or name == "reshape_and_cache_flash":
                stack.enter_context(patched(module, name, op))
        stack.enter_context(patched(torch.ops, "_C_cache_ops", types.SimpleNamespace(reshape_and_cache_flash=op)))
        yield


def impl_for(impl_cls: type, fa_module: types.ModuleType) -> Any:
    """The release's FlashAttentionImpl without its __init__ (which queries the CUDA device): the write path only
    reads these attributes; one it needs beyond them surfaces as a ProbeError naming it."""
    impl = object.__new__(impl_cls)
    attn_type = getattr(fa_module, "AttentionType", None)
    vars(impl).update(
        attn_type=getattr(attn_type, "DECODER", "decoder"),
        head_size=DIMS.head_dim,
        num_heads=DIMS.kv_heads,
        num_kv_heads=DIMS.kv_heads,
        kv_cache_dtype="auto",
        kv_sharing_target_layer_name=None,
        vllm_flash_attn_version=2,
    )
    return impl


def layer() -> Any:
    return types.SimpleNamespace(_k_scale=torch.ones(()), _v_scale=torch.ones(()), _k_scale_float=1.0, _v_scale_float=1.0)


def observe_write(
    write: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None],
    kv_cache: torch.Tensor,
    whole: torch.Tensor,
    c: Contract,
    path: str,
    calls: list,
) -> dict[str, Any]:
    """Run the release's write path `write(key, value, kv_cache, slot_mapping)` into a NaN-poisoned cache and
    report where K and V landed; ProbeError unless they landed exactly where `c`'s split puts them.

    K holds distinct positive values, V their negatives, so every landed cell says whose and which element it is.
    `whole` is the entire allocation (all layers), to catch a write outside this layer's view.
    """
    h, d = DIMS.kv_heads, DIMS.head_dim
    slots = torch.tensor(SLOTS, dtype=torch.int64)
    key = (torch.arange(len(SLOTS) * h * d, dtype=torch.float32) + 1).reshape(len(SLOTS), h, d)
    value = -key
    whole.fill_(float("nan"))
    calls.clear()
    try:
        write(key, value, kv_cache, slots)
    except Written:
        pass
    except AttributeError as e:
        raise ProbeError(f"{path} needs {e} that the probe does not provide") from e
    if not calls:
        raise ProbeError(f"{path} did not call reshape_and_cache_flash")
    landed = {}
    for sign, who in ((1, "K"), (-1, "V")):
        idx = (kv_cache * sign > 0).nonzero()
        landed[who] = {a: sorted(set(idx[:, i].tolist())) for i, a in enumerate(c.layout.logical)}
    split = [a for a in c.layout.logical if not set(landed["K"][a]) & set(landed["V"][a])]
    if len(split) != 1:
        raise ProbeError(f"{path}: K and V did not land on disjoint parts of one axis: {landed}")
    ax = split[0]
    where = {who: _span(ax, landed[who][ax]) for who in ("K", "V")}
    expected = {"K": "C[0:32]", "V": "C[32:64]"} if c.layout.packed else {"K": "KV=0", "V": "KV=1"}
    if where != expected:
        raise ProbeError(
            f"{path} writes K at {where['K']} and V at {where['V']}; {c.describe()} expects K at {expected['K']}, "
            f"V at {expected['V']}: no known contract splits this way"
        )
    k_view, v_view = views.split(c, kv_cache)
    blocks, offs = slots // DIMS.block_size, slots % DIMS.block_size
    if not (torch.equal(k_view[blocks, offs], key) and torch.equal(v_view[blocks, offs], value)):
        raise ProbeError(f"{path}: K/V values are not at their slots in the views {c.describe()} gives")
    stray = int((~whole.isnan()).sum()) - 2 * key.numel()
    if stray:
        raise ProbeError(f"{path} wrote {stray} cells outside the slots' K and V views of {c.describe()}")
    return {"path": path, "op_calls": list(calls), "K": where["K"], "V": where["V"], "tokens": len(SLOTS), "stray_cells": 0}


def _span(axis: str, idx: list[int]) -> str:
    if len(idx) == 1:
        return f"{axis}={idx[0]}"
    if idx != list(range(idx[0], idx[-1] + 1)):
        return f"{axis}{idx}"
    return f"{axis}[{idx[0]}:{idx[-1] + 1}]"


def dedupe(contracts: list[Contract]) -> tuple[Contract, ...]:
    """One contract per distinct geometry, in probe order; settings that give the same geometry (e.g. one layer
    under LBNHC and under BLNHC) share it, their names joined in its origin."""
    merged: dict[Contract, Contract] = {}
    for c in contracts:
        if c in merged:
            first = merged[c]
            c = dataclasses.replace(c, origin=dataclasses.replace(
                first.origin, setting=f"{first.origin.setting} + {c.origin.setting}"))
        merged[c] = c
    return tuple(merged.values())
