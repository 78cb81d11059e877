"""The layout API a KV-cache consumer sees in the installed release: its surface (which names exist, with which
signatures) and its answers at several argument sets, kept in the recording's `api` field for the replay stand-ins
(harness.vllm_api) and compared by the live drift check.

Surface, per backend class of harness.backends.BACKENDS: every name of `vllm_api.surface.BACKEND_MEMBERS`
the class has, with its kind (staticmethod, classmethod, property, value) and `inspect.signature` text; per
module of `vllm_api.surface.MODULES`: its layout functions and the KVCacheLayout enum (members, values, every
property's answer per member), and the public names it holds (what a consumer may import from it).

Answers, per backend: `get_kv_cache_shape` at SHAPE_SIZES x every cache dtype string the release knows of (its
`supported_kv_cache_dtypes`, kvconform's, and one no release accepts) x the block sizes of BLOCK_SIZES; the
stride order under each VLLM_KV_CACHE_LAYOUT setting (NHD, HND, unset, a bad value) with and without the layers
dimension; `supported_kv_cache_layouts()` on the CPU and per device class; every zero-argument flag. A refusal
is an answer too (its exception type and text).
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import types
from typing import Any

from harness.backends import BACKENDS, LAYOUT_VALUES, layout_env
from harness.contract import CACHE_DTYPES
from harness.probe.era_stride import takes_cache_dtype
from harness.probe.imports import NotImportable, backend, device, module
from harness.probe.observe import HEAD_DIM_V, patched
from harness.vllm_api import surface

# (num_blocks, block_size, num_kv_heads, head_size): DIMS, other sizes, modelopt's plugin's sentinel, an
# offloader's; head sizes off a multiple of 16 show how a packed width rounds.
SHAPE_SIZES = ((3, 16, 4, 32), (7, 32, 2, 64), (3, 16, 1, 16), (1234, 16, 8, 128), (5, 48, 3, 24), (2, 16, 6, 40))
BLOCK_SIZES = (1, 8, 24, 64, 272)  # at DIMS' other sizes: which block sizes a backend refuses
BAD_DTYPE = "no_such_dtype"
LAYOUT_SETTINGS = (*LAYOUT_VALUES, None, "XYZ")  # None: the setting unset; XYZ: a value no release accepts


def record() -> dict[str, Any]:
    """The installed release's layout API surface and answers (the recording's `api` field)."""
    out: dict[str, Any] = {"format": surface.FORMAT, "modules": {}, "backends": {}}
    for name, wanted in surface.MODULES.items():
        mod = module(name)
        out["modules"][name] = None if mod is None else _module(mod, wanted)
    for b in BACKENDS:
        try:
            with backend(b) as (mod, cls, _):
                if cls is None:
                    out["backends"][b.name] = {"present": False}
                    continue
                try:
                    out["backends"][b.name] = {
                        "present": True, "module": b.path, "class": b.cls,
                        "members": {n: surface.describe(cls, n) for n in surface.BACKEND_MEMBERS if hasattr(cls, n)},
                        "module_names": sorted(n for n in vars(mod) if not n.startswith("_")),
                        "answers": _answers(b, cls, mod),
                    }
                except Exception as e:  # noqa: BLE001 - kept, named: replay refuses this backend's stand-in with it
                    out["backends"][b.name] = {"present": True, "error": f"{type(e).__name__}: {e}"}
        except NotImportable as e:
            out["backends"][b.name] = {"present": True, "error": str(e)}
    return out


def _module(mod: types.ModuleType, wanted: tuple[str, ...]) -> dict[str, Any]:
    names = {}
    for n in wanted:
        if not hasattr(mod, n):
            continue
        obj = getattr(mod, n)
        if isinstance(obj, type) and issubclass(obj, enum.Enum):
            names[n] = surface.describe_enum(obj)
        else:
            names[n] = {"kind": "function", "signature": surface.signature(obj)}
    answers = []
    if "get_kv_cache_layout" in names:
        for setting in LAYOUT_SETTINGS:
            with layout_env(setting):
                answers.append(surface.answer("get_kv_cache_layout", (), {}, {"env": setting}, mod.get_kv_cache_layout))
    return {"names": names, "public": sorted(n for n in vars(mod) if not n.startswith("_")), "answers": answers}


def _answers(b, cls: type, mod: types.ModuleType) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    state = {"head_size_v": HEAD_DIM_V} if "head_size_v" in vars(cls) or b.diff_kv else {}

    def ask(method: str, args: tuple = (), kwargs: dict | None = None, **where: Any) -> None:
        fn = getattr(cls, method)
        out.append(surface.answer(method, args, kwargs or {}, where, lambda: fn(*args, **(kwargs or {}))))

    with contextlib.ExitStack() as stack:
        for k, v in state.items():
            stack.enter_context(patched(cls, k, v))
        if hasattr(cls, "get_kv_cache_shape"):
            takes = takes_cache_dtype(cls)
            for sizes in SHAPE_SIZES:
                ask("get_kv_cache_shape", sizes, state=state)
                for dtype in _dtype_strings(cls) if takes else ():
                    ask("get_kv_cache_shape", sizes, {"cache_dtype_str": dtype}, state=state)
            for bs in BLOCK_SIZES:
                ask("get_kv_cache_shape", (3, bs, 4, 32), state=state)
        if hasattr(cls, "get_kv_cache_stride_order"):
            layers = "include_num_layers_dimension" in inspect.signature(cls.get_kv_cache_stride_order).parameters
            for setting in LAYOUT_SETTINGS:
                with layout_env(setting):
                    ask("get_kv_cache_stride_order", env=setting)
                    if layers:
                        for flag in (False, True):
                            ask("get_kv_cache_stride_order", (), {"include_num_layers_dimension": flag}, env=setting)
    if hasattr(cls, "supported_kv_cache_layouts"):
        ask("supported_kv_cache_layouts", device=None)
        for cap in surface.DEVICE_CLASSES:
            with device(mod, cap):
                ask("supported_kv_cache_layouts", device=f"sm{cap[0]}{cap[1]}")
    for n in surface.FLAGS:
        if callable(getattr(cls, n, None)):
            ask(n)
    return out


def _dtype_strings(cls: type) -> list[str]:
    declared = list(getattr(cls, "supported_kv_cache_dtypes", None) or ())
    return list(dict.fromkeys(["auto", "float16", "bfloat16", "fp8", *CACHE_DTYPES, *declared, BAD_DTYPE]))
