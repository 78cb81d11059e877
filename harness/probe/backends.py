"""Every attention backend's contracts beside FLASH_ATTN's model-dtype ones (which the era adapters read, with the
write observed): harness.backends.BACKENDS says where each backend's class lives and what kind of cache it keeps,
DTYPES which cache dtypes to ask it about; `read` asks the installed release with the same API the era adapters use.

| API of the release | how a backend's layout is read |
|---|---|
| `KVCacheLayout` enum (0.29 -) | the backend's `customize_spec` on an attention spec of the cache dtype, then `create_kv_cache_views` under every layout its `supported_kv_cache_layouts()` allows, one and DIMS.num_layers layers; device-class answers (FlashInfer on compute capability 10) by stubbing the platform query, once per class |
| `get_kv_cache_shape` (- 0.28) | `get_kv_cache_shape(..., cache_dtype_str=)` where it takes the dtype, `get_kv_cache_stride_order()` under VLLM_KV_CACHE_LAYOUT=NHD/HND where the backend has one |

A cache dtype is asked about only where the backend's `supported_kv_cache_dtypes` lists it (before that attribute
existed: the model dtype only). Each axis is named by its size (all differ at DIMS, V's head dim too), the
contract is built from the names and must reproduce the tensor exactly, or the probe fails naming the backend.

Adding a backend: add its line to harness.backends.BACKENDS and its cache dtypes to DTYPES. If its kv_cache splits
K and V in a way no family of harness.contract expresses, add the family there first (FAMILIES, `split`, `size`);
until then the probe rejects it by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.util
import inspect
import math
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

from harness.probe import observe as p
from harness.backends import BACKENDS, LAYOUT_ENV, LAYOUT_VALUES, Backend, layout_env
from harness.contract import ALIASES, CACHE_DTYPES, Contract, ContractError, Dims, Row, views

HEAD_DIM_V = 24  # V's head dim for the diff-KV backends: differs from every other size at DIMS
CAPABILITIES = ((9, 0), (10, 0))  # device classes a backend may answer differently for (Hopper, Blackwell)


# The cache dtypes asked about per backend (FLASH_ATTN's model dtype is the era adapters').
DTYPES = {
    "FLASH_ATTN": ("fp8_e4m3",),
    "FLASHINFER": ("auto", "fp8_e4m3", "fp8_e5m2", "nvfp4"),
    "TRITON_ATTN": ("auto", "fp8_e4m3", "fp8_e5m2", "fp8_per_token_head"),
    "FLEX_ATTENTION": ("auto",),
    "FLASH_ATTN_DIFFKV": ("auto", "fp8_e4m3"),
    "TRITON_MLA": ("auto", "fp8_e4m3"),
}


def read(version: str, enum_era: bool) -> tuple[list[Contract], dict[str, Any]]:
    """Every backend's contracts in the installed release, and per backend what was asked and answered (or why
    it was not: the backend does not exist in this release)."""
    contracts: list[Contract] = []
    observed: dict[str, Any] = {}
    for b in BACKENDS:
        stubbed = ""
        try:
            try:
                mod = p.module(b.path)
            except p.ProbeError as e:
                stubbed = (getattr(e.__cause__, "name", None) or "").split(".")[0]
                if stubbed not in p.GPU_LIBRARIES:
                    raise
                with stubs(stubbed):
                    mod = p.module(b.path)
        except Exception as e:  # noqa: BLE001 - any import failure; the drift check names it, the others are read
            err = e.__cause__ if isinstance(e, p.ProbeError) and e.__cause__ is not None else e
            observed[b.name] = {"present": True, "read": False,
                                "why": f"not importable: importing {b.path} raised {type(err).__name__}: {err}"}
            continue
        cls = getattr(mod, b.cls, None) if mod is not None else None
        if cls is None:
            observed[b.name] = {"present": False, "why": f"no {b.path}.{b.cls} in this release"}
            continue
        found, settings = [], {}
        try:
            for name in _dtypes(b, cls):
                reader = _enum_views if enum_era else _shape_views
                for setting, c, obs in reader(version, b, cls, name, mod):
                    found.append(c)
                    settings[f"{name} {setting}"] = obs
        except Exception as e:  # noqa: BLE001 - kept in the recording, named; FLASH_ATTN's contracts still stand
            observed[b.name] = {"present": True, "read": False, "why": f"{type(e).__name__}: {e}"}
            continue
        contracts += p.dedupe(found)
        observed[b.name] = {"present": True, "read": True, "class": f"{b.path}.{b.cls}", "settings": settings,
                            **({"gpu_library_stubbed": f"{stubbed} is not installed with this release: its module "
                                f"was imported with {stubbed} stubbed, the contracts read from the backend's own "
                                "Python declarations"} if stubbed else {}),
                            "supported_kv_cache_dtypes": _declared(cls)}
    return contracts, observed


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


def dims(b: Backend) -> Dims:
    """The sizes a backend is asked at: DIMS, with V's own head dim for diff-KV and one head for a latent cache."""
    if b.latent:
        return dataclasses.replace(p.DIMS, kv_heads=1)
    return dataclasses.replace(p.DIMS, head_dim_v=HEAD_DIM_V) if b.diff_kv else p.DIMS


def names(b: Backend, cache_dtype: str, layers: bool) -> dict[int, str]:
    """Axis letter by size for this backend and cache dtype at its dims (ProbeError if two sizes coincide)."""
    d, w = dims(b), CACHE_DTYPES[cache_dtype].width
    if b.latent:
        sizes = {"B": d.num_blocks, "N": d.block_size, "H": 1, "R": w(d.head_dim)}
    elif b.diff_kv:
        sizes = {"B": d.num_blocks, "N": d.block_size, "H": d.kv_heads, "C": w(d.head_dim) + w(d.v_dim)}
    else:
        sizes = {"B": d.num_blocks, "KV": 2, "N": d.block_size, "H": d.kv_heads, "S": 2 * d.kv_heads,
                 "D": w(d.head_dim), "C": 2 * w(d.head_dim)}
    if layers:
        sizes["L"] = d.num_layers
    out = {s: a for a, s in sizes.items()}
    if len(out) != len(sizes):
        raise p.ProbeError(f"{b.name} {cache_dtype}: axis sizes {sizes} at {d} do not all differ")
    return out


def axes(b: Backend, cache_dtype: str, shape: tuple[int, ...], what: str, layers: bool = False) -> tuple[str, ...]:
    table = names(b, cache_dtype, layers)
    out = tuple(table.get(s, "?") for s in shape)
    if "?" in out or len(set(out)) != len(out):
        raise p.ProbeError(f"{b.name} {cache_dtype}: {what} returned shape {tuple(shape)} at {dims(b)}: sizes "
                           f"{ {s: a for s, a in table.items()} } do not name its axes")
    return out


def contract(b: Backend, logical, phys, origin: str, cache_dtype: str) -> Contract:
    try:
        return Contract.of(logical, phys, origin, cache_dtype, b.diff_kv)
    except ContractError as e:
        raise p.ProbeError(f"{b.name}: {e}") from None


# ---- the KVCacheLayout era --------------------------------------------------------------------------------------


def _enum_views(version: str, b: Backend, cls: type, cache_dtype: str, mod: types.ModuleType):
    iface = p.module("vllm.v1.kv_cache_interface")
    layouts = p.module("vllm.v1.kv_cache_layout").KVCacheLayout
    allowed: dict[Any, list[str]] = {}
    for cap in CAPABILITIES:
        for member in _supported(cls, mod, layouts, cap):
            allowed.setdefault(member, []).append(f"sm{cap[0]}{cap[1]}")
    for member, classes in allowed.items():
        for count, what in ((1, "single-layer"), (p.DIMS.num_layers, "cross-layer")):
            d = dataclasses.replace(dims(b), num_layers=count, layer=min(p.DIMS.layer, count - 1))
            spec = _spec(iface, b, cls, cache_dtype, d)
            strides = iface.compute_layout_strides(spec, d.num_blocks, d.num_layers, member)
            tensor = iface.KVCacheTensor(size=spec.page_size_bytes * d.num_blocks * d.num_layers,
                                         layers=[f"layers.{i}" for i in range(d.num_layers)],
                                         layer_stride=strides[0], block_stride=strides[1])
            raw = torch.empty(tensor.size, dtype=torch.int8)
            made = iface.create_kv_cache_views(raw, spec, d.num_blocks, member, tensor)
            kv_cache = made[d.layer]
            logical = axes(b, cache_dtype, tuple(kv_cache.shape), "create_kv_cache_views")
            named = {a: s for a, s, n in zip(logical, kv_cache.stride(), kv_cache.shape) if n > 1}
            if count > 1:
                named["L"] = made[1].storage_offset() - made[0].storage_offset()
            phys = _physical(logical, named, member, count)
            only = "" if len(classes) == len(CAPABILITIES) else f" ({', '.join(classes)})"
            setting = f"{member.name} {what}{only}"
            c = contract(b, logical, phys, f"vllm {version} {b.name} {setting}", cache_dtype)
            p.check_view(c, kv_cache, kv_cache.storage_offset(), d)
            yield setting, c, {"stride_order": list(member.stride_order), "device_classes": classes,
                               "spec": {"num_heads": spec.num_heads, "state_content_size_bytes":
                                        spec.state_content_size_bytes, "dtype": str(spec.dtype)},
                               "kv_cache": p.view_record(kv_cache),
                               "write": _write(b, cls, mod, c, kv_cache, raw.view(kv_cache.dtype))}


def _supported(cls: type, mod: types.ModuleType, layouts, cap: tuple[int, int]) -> list:
    platform = p.module("vllm.platforms.interface")
    stub = types.SimpleNamespace(get_device_capability=lambda *a, **k: platform.DeviceCapability(*cap),
                                 is_device_capability=lambda c: c == cap[0] * 10 + cap[1],
                                 is_device_capability_family=lambda c: c // 10 == cap[0])
    with p.patched(mod, "current_platform", stub) if hasattr(mod, "current_platform") else contextlib.nullcontext():
        supported = cls.supported_kv_cache_layouts()
    return list(layouts) if supported is None else list(supported)


def _spec(iface, b: Backend, cls: type, cache_dtype: str, d: Dims):
    element = CACHE_DTYPES[cache_dtype].element or torch.float16
    fields = {f.name for f in dataclasses.fields(iface.FullAttentionSpec)}
    kw: dict[str, Any] = dict(block_size=d.block_size, num_kv_heads=d.kv_heads, head_size=d.head_dim, dtype=element)
    if "kv_quant_mode" in fields:
        kw["kv_quant_mode"] = iface.get_kv_quant_mode(cache_dtype)
    if b.latent:
        kw["cache_dtype_str"] = cache_dtype
        spec = iface.MLAAttentionSpec(**kw)
    else:
        if b.diff_kv:
            kw["head_size_v"] = d.v_dim
        spec = iface.FullAttentionSpec(**kw)
    customize = getattr(cls, "customize_spec", None)
    return customize(spec) if customize is not None else spec


def _physical(logical, named: dict[str, int], member, count: int) -> tuple[str, ...]:
    # A size-1 axis (a latent cache's one head slot) has no telling stride: the layout member places it.
    heads = "S" if "S" in logical else "H"
    enum_axes = ("L", "B", heads, "N", logical[-1])
    declared = tuple(enum_axes[i] for i in member.stride_order if count > 1 or enum_axes[i] != "L")
    phys = p.physical(named)
    if tuple(a for a in declared if a in named) != phys:
        raise p.ProbeError(f"{member} declares physical order {'.'.join(declared)} but create_kv_cache_views "
                           f"built {'.'.join(phys)} (strides {named})")
    return declared


# ---- the backend's own cache write -------------------------------------------------------------------------------

WRITE_OPS = ("reshape_and_cache_flash", "triton_reshape_and_cache_flash")  # module-level names backends call
IMPL_STATE = {"is_kvcache_nvfp4": False, "nvfp4_fa2": False, "_is_per_token_head_quant": False,  # a model-dtype
              "_set_kv_ptr_range": False, "fp8_dtype": torch.float8_e4m3fn, "cache_dtype": "auto"}  # cache's answers


def _write(b: Backend, cls: type, mod: types.ModuleType, c: Contract, kv_cache: torch.Tensor,
           whole: torch.Tensor) -> dict[str, Any] | str:
    """Where the backend's own do_kv_cache_update puts K and V (p.observe_write), for a model-dtype K/V cache;
    otherwise why not: a quantising write is a CUDA kernel with no CPU stand-in, and before the method existed
    each backend wrote inside its forward."""
    if c.layout.latent:
        return "not observed: a latent cache has no K/V split to compare"
    if c.diff_kv:
        return "not observed: the write stand-in takes one head dim for K and V"
    impl_cls = cls.get_impl_cls()
    if "do_kv_cache_update" not in dir(impl_cls):
        return "not observed: this release writes the cache inside the backend's forward"
    impl = p.impl_for(impl_cls, mod)
    vars(impl).update(IMPL_STATE)
    if c.cache_dtype != "auto":
        return _views_written(impl, impl_cls, mod, c, kv_cache)
    calls: list = []
    with p.write_ops(mod, p.scatter(calls, stop=False), WRITE_OPS):

        def write(key, value, cache, slots):
            impl.do_kv_cache_update(p.layer(), key, value, cache, slots)

        try:
            return p.observe_write(write, kv_cache, whole, c, f"{impl_cls.__name__}.do_kv_cache_update", calls)
        except p.ProbeError as e:
            if isinstance(e.__cause__, AttributeError):  # state its __init__ sets from a live engine
                return f"not observed: {e}"
            raise


def _views_written(impl, impl_cls: type, mod: types.ModuleType, c: Contract, kv_cache: torch.Tensor) -> dict | str:
    """For a quantised cache, whose write is a CUDA kernel: the K and V views the backend's do_kv_cache_update
    hands that kernel, compared with the contract's split (shape, strides, offset: the retype aside)."""
    vars(impl).update(kv_cache_dtype=c.cache_dtype, cache_dtype=c.cache_dtype,
                      is_kvcache_nvfp4=c.dtype.row is Row.FP4_PAGE, _is_per_token_head_quant=c.dtype.row is Row.SCALED,
                      _k_scale_cache=None, _v_scale_cache=None)
    quant_mode = getattr(p.module("vllm.v1.kv_cache_interface"), "get_kv_quant_mode", None)
    if quant_mode is not None:
        impl._kv_quant_mode = quant_mode(c.cache_dtype)
    seen: list = []

    def record(key, value, key_cache, value_cache, *rest, **kwargs):
        seen.append((key_cache, value_cache))
        raise p.Written

    path = f"{impl_cls.__name__}.do_kv_cache_update"
    h, d = p.DIMS.kv_heads, p.DIMS.head_dim
    key = torch.zeros(len(p.SLOTS), h, d)
    with p.write_ops(mod, record, WRITE_OPS + ("triton_reshape_and_cache_flash_per_token_head_quant",)):
        try:
            impl.do_kv_cache_update(p.layer(), key, key, kv_cache, torch.tensor(p.SLOTS))
        except p.Written:
            pass
        except AttributeError as e:
            return f"not observed: {path} needs {e} that the probe does not provide"
    if not seen:
        return f"not observed: {path} called no known write op ({', '.join(WRITE_OPS)})"
    got = [p.view_record(t) for t in seen[0]]
    want = [p.view_record(t) for t in views.split(c, kv_cache)]
    if got != want:
        raise p.ProbeError(f"{path} hands its {c.cache_dtype} write K/V views {got}, but {c.describe()} splits "
                           f"into {want}")
    return {"path": path, "views": "K and V views equal the contract's split", "K": got[0], "V": got[1]}


# ---- the get_kv_cache_shape era ---------------------------------------------------------------------------------


def takes_cache_dtype(cls: type) -> bool:
    """Whether the backend's get_kv_cache_shape takes `cache_dtype_str`."""
    return "cache_dtype_str" in inspect.signature(cls.get_kv_cache_shape).parameters


def asked_shape(b: Backend, cls: type, cache_dtype: str) -> tuple[int, ...]:
    """`cls.get_kv_cache_shape` at the backend's probe sizes (each axis size distinct, so `axes` names them)."""
    d = dims(b)
    args = (d.num_blocks, d.block_size, d.kv_heads, d.head_dim)
    # The diff-KV backends keep V's head dim as class state (`head_size_v`), set by the model.
    with p.patched(cls, "head_size_v", d.v_dim) if b.diff_kv else contextlib.nullcontext():
        if takes_cache_dtype(cls):
            return tuple(cls.get_kv_cache_shape(*args, cache_dtype_str=cache_dtype))
        return tuple(cls.get_kv_cache_shape(*args))


def _shape_views(version: str, b: Backend, cls: type, cache_dtype: str, mod: types.ModuleType):
    takes_dtype = takes_cache_dtype(cls)
    if not takes_dtype and not CACHE_DTYPES[cache_dtype].values_only:
        return
    d = dataclasses.replace(dims(b), num_layers=1, layer=0)
    shape = asked_shape(b, cls, cache_dtype)
    logical = axes(b, cache_dtype, shape, "get_kv_cache_shape")
    orders = {"default": None}
    stride_fn = getattr(cls, "get_kv_cache_stride_order", None)
    if stride_fn is not None:
        try:
            orders = {}
            for value in LAYOUT_VALUES:
                with layout_env(value):
                    orders[f"{LAYOUT_ENV}={value}"] = tuple(stride_fn())
        except NotImplementedError:
            orders = {"default": None}
    element = CACHE_DTYPES[cache_dtype].element or torch.float16
    for setting, order in orders.items():
        order = order or tuple(range(len(shape)))
        if sorted(order) != list(range(len(shape))):
            raise p.ProbeError(f"{b.name}.get_kv_cache_stride_order() returned {order} for shape {shape}")
        buf = torch.empty(math.prod(shape), dtype=element)
        kv_cache = buf.view([shape[i] for i in order]).permute(*[order.index(i) for i in range(len(order))])
        c = contract(b, logical, p.physical(dict(zip(logical, kv_cache.stride()))),
                     f"vllm {version} {b.name} {setting}", cache_dtype)
        p.check_view(c, kv_cache, 0, d)
        with layout_env(setting.split("=")[-1]) if "=" in setting else contextlib.nullcontext():
            write = _write(b, cls, mod, c, kv_cache, buf)
        yield setting, c, {"get_kv_cache_shape": list(shape), "cache_dtype_str_argument": takes_dtype,
                           "stride_order": list(order), "kv_cache": p.view_record(kv_cache), "write": write}


# ---- importing a backend whose GPU library a CPU install lacks ---------------------------------------------------


class _Anything:
    """Whatever a stubbed library's attribute is used as at import time: called, subclassed, subscripted, or/ed
    in a type hint, used as a decorator."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, name: str) -> _Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # a decorator
        return _Anything(f"{self._name}()")

    def __mro_entries__(self, bases):
        return (object,)

    def __getitem__(self, item):
        return self

    def __or__(self, other):
        return self

    __ror__ = __or__


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> _Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self.__name__}.{name}")


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name, path, target=None):
        if name == self.root or name.startswith(self.root + "."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Stub(spec.name)

    def exec_module(self, module) -> None:
        pass


@contextlib.contextmanager
def stubs(root: str) -> Iterator[None]:
    """Import with `root` (a GPU library) and its submodules served as stubs; they are gone afterwards."""
    finder = _Stubs(root)
    # First on the path: a library that is installed but broken must not be found before its stub.
    for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
            del sys.modules[name]
