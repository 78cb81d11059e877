"""Where a backend's own cache write puts K and V: the release's write path runs on the CPU with vLLM's CUDA op
`reshape_and_cache_flash` replaced by `scatter` (same semantics), into a NaN-poisoned cache. Before 0.15 the write
is the first thing an impl's forward does (`FORWARD`); from 0.15 it is the impl's do_kv_cache_update (`METHOD`).
`observed` is the one entry: the landing, or why it was not observed."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.backends import Backend
from harness.contract import Contract, Row, views
from harness.probe.imports import module
from harness.probe.observe import DIMS, SLOTS, ProbeError, patched, view_record

FORWARD, METHOD = "forward", "do_kv_cache_update"
WRITE_OPS = ("reshape_and_cache_flash", "triton_reshape_and_cache_flash")  # module-level names backends call
QUANT_OPS = WRITE_OPS + ("triton_reshape_and_cache_flash_per_token_head_quant",)
IMPL_STATE = {"is_kvcache_nvfp4": False, "nvfp4_fa2": False, "_is_per_token_head_quant": False,  # a model-dtype
              "_set_kv_ptr_range": False, "fp8_dtype": torch.float8_e4m3fn, "cache_dtype": "auto"}  # cache's answers
# The forward the probe can drive: it builds FlashAttention's metadata (num_actual_tokens, slot_mapping) and no
# other backend's.
FORWARD_IMPL = "FlashAttentionImpl"


class Written(Exception):
    """Raised by the scatter to stop a forward pass right after its cache write."""


def observed(path: str, b: Backend, cls: type, mod: types.ModuleType, c: Contract, kv_cache: torch.Tensor,
             whole: torch.Tensor) -> dict[str, Any] | str:
    """Where the backend's write (`path`: FORWARD or METHOD) puts K and V in `kv_cache`, one layer's view of `whole`;
    for a quantised cache, whose write is a CUDA kernel, the K and V views the write hands that kernel; otherwise why
    not (a string)."""
    if c.layout.latent:
        return "not observed: a latent cache has no K/V split to compare"
    if c.diff_kv:
        return "not observed: the write stand-in takes one head dim for K and V"
    impl_cls = cls.get_impl_cls()
    if path == FORWARD:
        if impl_cls.__name__ != FORWARD_IMPL or c.cache_dtype != "auto":
            return "not observed: this release writes the cache inside the backend's forward"
        return _forward(impl_cls, mod, c, kv_cache, whole)
    if "do_kv_cache_update" not in dir(impl_cls):
        return "not observed: this release writes the cache inside the backend's forward"
    impl = impl_for(impl_cls, mod)
    vars(impl).update(IMPL_STATE)
    if c.cache_dtype != "auto":
        return _views_written(impl, impl_cls, mod, c, kv_cache)
    calls: list = []
    with write_ops(mod, scatter(calls, stop=False), WRITE_OPS):

        def write(key, value, cache, slots):
            impl.do_kv_cache_update(layer(), key, value, cache, slots)

        try:
            return landing(write, kv_cache, whole, c, f"{impl_cls.__name__}.do_kv_cache_update", calls)
        except ProbeError as e:
            if isinstance(e.__cause__, AttributeError):  # state its __init__ sets from a live engine
                return f"not observed: {e}"
            raise


def _forward(impl_cls: type, mod: types.ModuleType, c: Contract, kv_cache: torch.Tensor,
             whole: torch.Tensor) -> dict[str, Any]:
    """The write at the start of the impl's forward, stopped by the scatter right after it."""
    impl = impl_for(impl_cls, mod)
    calls: list = []

    def write(key, value, cache, slots):
        n = len(slots)
        meta = types.SimpleNamespace(num_actual_tokens=n, slot_mapping=slots)
        out = torch.zeros(n, DIMS.kv_heads * DIMS.head_dim)
        impl.forward(layer(), torch.zeros_like(key), key, value, cache, meta, output=out)

    with write_ops(mod, scatter(calls, stop=True)):
        return landing(write, kv_cache, whole, c, f"{impl_cls.__name__}.forward", calls)


def _views_written(impl, impl_cls: type, mod: types.ModuleType, c: Contract, kv_cache: torch.Tensor) -> dict | str:
    """The K and V views a quantised cache's do_kv_cache_update hands its write kernel, compared with the contract's
    split (shape, strides, offset: the retype aside)."""
    vars(impl).update(kv_cache_dtype=c.cache_dtype, cache_dtype=c.cache_dtype,
                      is_kvcache_nvfp4=c.dtype.row is Row.FP4_PAGE, _is_per_token_head_quant=c.dtype.row is Row.SCALED,
                      _k_scale_cache=None, _v_scale_cache=None)
    quant_mode = getattr(module("vllm.v1.kv_cache_interface"), "get_kv_quant_mode", None)
    if quant_mode is not None:
        impl._kv_quant_mode = quant_mode(c.cache_dtype)
    seen: list = []

    def record(key, value, key_cache, value_cache, *rest, **kwargs):
        seen.append((key_cache, value_cache))
        raise Written

    path = f"{impl_cls.__name__}.do_kv_cache_update"
    key = torch.zeros(len(SLOTS), DIMS.kv_heads, DIMS.head_dim)
    with write_ops(mod, record, QUANT_OPS):
        try:
            impl.do_kv_cache_update(layer(), key, key, kv_cache, torch.tensor(SLOTS))
        except Written:
            pass
        except AttributeError as e:
            return f"not observed: {path} needs {e} that the probe does not provide"
    if not seen:
        return f"not observed: {path} called no known write op ({', '.join(WRITE_OPS)})"
    got = [view_record(t) for t in seen[0]]
    want = [view_record(t) for t in views.split(c, kv_cache)]
    if got != want:
        raise ProbeError(f"{path} hands its {c.cache_dtype} write K/V views {got}, but {c.describe()} splits "
                         f"into {want}")
    return {"path": path, "views": "K and V views equal the contract's split", "K": got[0], "V": got[1]}


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
def write_ops(mod: types.ModuleType, op: Callable, names: tuple[str, ...] = ("reshape_and_cache_flash",)
              ) -> Iterator[None]:
    """`op` in place of the release's cache-write ops: `mod`'s names among `names` (reshape_and_cache_flash even
    where absent: FLASH_ATTN imports it only with CUDA) and torch.ops._C_cache_ops.reshape_and_cache_flash."""
    with contextlib.ExitStack() as stack:
        for name in names:
            if hasattr(mod, name) or name == "reshape_and_cache_flash":
                stack.enter_context(patched(mod, name, op))
        stack.enter_context(patched(torch.ops, "_C_cache_ops", types.SimpleNamespace(reshape_and_cache_flash=op)))
        yield


def impl_for(impl_cls: type, mod: types.ModuleType) -> Any:
    """The release's impl without its __init__ (which queries the CUDA device): the write path only reads these
    attributes; one it needs beyond them surfaces as a ProbeError naming it."""
    impl = object.__new__(impl_cls)
    attn_type = getattr(mod, "AttentionType", None)
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


def landing(
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
