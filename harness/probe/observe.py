"""How the probe looks at what a release builds: its fixed sizes (every axis size distinct, so each axis is named by
its size and never guessed), naming a tensor's axes and physical order, the contract read from them, and the check
that the tensor the release built has exactly that contract's geometry."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from harness.backends import Backend
from harness.contract import CACHE_DTYPES, Contract, ContractError, Dims, views

# num_blocks=3 (not 2, which equals the K/V axis), layers 5: every axis size differs from every other.
DIMS = Dims(num_blocks=3, block_size=16, kv_heads=4, head_dim=32, num_layers=5, layer=1)
HEAD_DIM_V = 24  # V's head dim for the diff-KV backends: differs from every other size at DIMS
SLOTS = (5, 32, 31, 41, 0)  # tokens in every block, at the first and last offsets of a block
MODEL_DTYPE = torch.float16  # the model's dtype: what a cache of `auto` (and any values-only dtype) holds


class ProbeError(ContractError):
    """The installed release's layout cannot be read, or contradicts itself (a `contract-error` outcome)."""


def dims(b: Backend, num_layers: int = DIMS.num_layers) -> Dims:
    """The sizes a backend is asked at, in an allocation of `num_layers`: DIMS, with V's own head dim for diff-KV
    and one head for a latent cache."""
    d = dataclasses.replace(DIMS, num_layers=num_layers, layer=min(DIMS.layer, num_layers - 1))
    if b.latent:
        return dataclasses.replace(d, kv_heads=1)
    return dataclasses.replace(d, head_dim_v=HEAD_DIM_V) if b.diff_kv else d


def element(cache_dtype: str) -> torch.dtype:
    """The element type a cache of `cache_dtype` is allocated in."""
    return CACHE_DTYPES[cache_dtype].element or MODEL_DTYPE


def axes(b: Backend, cache_dtype: str, shape: tuple[int, ...], what: str, layers: bool = False) -> tuple[str, ...]:
    """Each axis of a shape the release built for backend `b` at its dims, named by its size (ProbeError when a size
    names no axis, or two sizes coincide)."""
    d, w = dims(b), CACHE_DTYPES[cache_dtype].width
    if b.latent:
        sizes = {"B": d.num_blocks, "N": d.block_size, "H": 1, "R": w(d.head_dim)}
    elif b.diff_kv:
        sizes = {"B": d.num_blocks, "N": d.block_size, "H": d.kv_heads, "C": w(d.head_dim) + w(d.v_dim)}
    else:
        sizes = {"B": d.num_blocks, "KV": 2, "N": d.block_size, "H": d.kv_heads, "S": 2 * d.kv_heads,
                 "D": w(d.head_dim), "C": 2 * w(d.head_dim)}
    if layers:
        sizes["L"] = DIMS.num_layers
    table = {s: a for a, s in sizes.items()}
    if len(table) != len(sizes):
        raise ProbeError(f"{b.name} {cache_dtype}: axis sizes {sizes} at {d} do not all differ")
    out = tuple(table.get(s, "?") for s in shape)
    if "?" in out or len(set(out)) != len(out):
        raise ProbeError(f"{b.name} {cache_dtype}: {what} returned shape {tuple(shape)} at {d}: sizes {table} do not "
                         "name its axes")
    return out


def physical(named: dict[str, int]) -> tuple[str, ...]:
    """Axes ordered outermost first by their strides (sizes all exceed 1, so strides are strictly ordered)."""
    return tuple(sorted(named, key=lambda a: -named[a]))


def contract(b: Backend, logical: tuple[str, ...], phys: tuple[str, ...], origin: str, cache_dtype: str) -> Contract:
    try:
        return Contract.of(logical, phys, origin, cache_dtype, b.diff_kv)
    except ContractError as e:
        raise ProbeError(f"{b.name}: {e}") from None


def check_view(c: Contract, kv_cache: torch.Tensor, layer_offset: int, d: Dims) -> None:
    """The tensor the release hands a layer must have exactly the contract's geometry at `d`."""
    want = views.geometry(c, d, kv_cache.dtype).kv_cache
    got = (tuple(kv_cache.shape), tuple(kv_cache.stride()), layer_offset)
    if got != (want.shape, want.stride, want.offset):
        raise ProbeError(
            f"release built kv_cache shape {got[0]} strides {got[1]} offset {got[2]}, but {c.describe()} "
            f"gives shape {want.shape} strides {want.stride} offset {want.offset} at {d}"
        )


def view_record(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(t.shape), "stride": list(t.stride()), "offset": t.storage_offset()}


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
