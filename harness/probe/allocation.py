"""What a release allocates for a whole model (harness.probe.models), read from its own planner and allocator.

Per model: the specs as the model runner hands them to the planner, `get_kv_cache_groups` and
`get_kv_cache_config_from_groups`, KV sharing (`add_kv_sharing_layers_to_kv_cache_groups`), the kernel block size of
each group, then the allocation of the release's era (`era`): the free allocator `allocate_kv_cache` over the layout
`resolve_kv_cache_layout` picks (0.29 -), or GPUModelRunner's own `initialize_kv_cache_tensors` on a runner holding
only what it reads (0.11 - 0.28). What a layer is handed is what binding gives it; what the connector is handed is
what the runner passes `register_kv_caches` (or `register_cross_layers_kv_cache`). The device is the CPU.

Bytes are counted from the start of each allocation. A layer's kernel block k belongs to manager block m when all
of k's bytes lie in m's, m's being read from the same allocation made at the manager block sizes. A step of the
release that raises is that model's answer (refused, or raised), recorded with its message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import types
from collections.abc import Iterator
from typing import Any

import torch

from harness.backends import backend_named, layout_env
from harness.probe.imports import NotImportable, backend, module
from harness.probe.models import CROSS_LAYER_LAYOUT, GRID, IFACE, MODELS, RECORDED, WORKER, ModelSpec, Sizing
from harness.probe.observe import ProbeError, patched

ATTN_UTILS = "vllm.v1.attention.backends.utils"
RUNNER = "vllm.v1.worker.gpu_model_runner"
MIXIN = "vllm.v1.worker.kv_connector_model_runner_mixin"
PLANNERS = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")  # newest first
Cache = torch.Tensor | list[torch.Tensor]  # a Mamba layer of the runner's releases gets a list of state tensors


def era() -> tuple[str | None, str]:
    """("free", what) where the release has the free allocator (0.29 -), ("runner", what) where the model runner's
    own methods allocate over the planner's groups and kernel block sizes (0.11 - 0.28), (None, why) otherwise."""
    worker, utils, planner = module(WORKER), module(ATTN_UTILS), _planner()
    if planner is None:
        return None, f"none of {', '.join(PLANNERS)} has get_kv_cache_groups and get_kv_cache_config_from_groups"
    if not all(hasattr(worker, n) for n in ("AttentionGroup", "add_kv_sharing_layers_to_kv_cache_groups")):
        return None, f"{WORKER} has no AttentionGroup or add_kv_sharing_layers_to_kv_cache_groups"
    if all(hasattr(worker, n) for n in ("allocate_kv_cache", "prepare_kernel_block_sizes")) and \
            all(hasattr(utils, n) for n in ("resolve_kv_cache_layout", "get_supported_kv_cache_layouts")):
        return "free", f"{WORKER}.allocate_kv_cache"
    try:
        runner = getattr(module(RUNNER), "GPUModelRunner", None)
    except Exception as e:  # noqa: BLE001 - why this release is not read
        return None, f"importing {RUNNER} raised {type(e).__name__}: {e}"
    if runner is None:
        return None, f"no {RUNNER}.GPUModelRunner"
    if "kernel_block_sizes" in inspect.signature(runner.initialize_kv_cache_tensors).parameters:
        return "runner", f"{RUNNER}.GPUModelRunner.initialize_kv_cache_tensors"
    return None, f"{RUNNER}.GPUModelRunner.initialize_kv_cache_tensors takes no kernel block sizes"


def _planner():
    for name in PLANNERS:
        m = module(name)
        if m is not None and hasattr(m, "get_kv_cache_groups") and hasattr(m, "get_kv_cache_config_from_groups"):
            return m
    return None


def allocations() -> dict[str, Any]:
    """Per model of MODELS, what the release allocates, or what it refused; {"read": False, "why"} where this
    reader does not understand the release."""
    kind, what = era()
    if kind is None:
        return {"read": False, "why": what}
    binds = "map_kv_caches_to_kernel_blocks" if hasattr(module(WORKER), "map_kv_caches_to_kernel_blocks") else None
    return {"read": True, "planner": _planner().__name__, "allocator": what,
            "layers_get": f"{WORKER}.{binds}" if binds else what,
            "models": {m.name: {"about": m.about, **allocation(m, kind)} for m in MODELS}}


def allocation(m: ModelSpec, kind: str) -> dict[str, Any]:
    """One model's allocation record, with its `instances` on the GRID where it has one; {"refused" or "raised":
    {step, error}} where a step of the release raised; {"absent": what} where the release has no such thing."""
    found = _answer(m, lambda: _plan_and_allocate(m, kind))
    if m.grid and "layers" in found:
        found["instances"] = [{**vars(at), **_answer(m, lambda at=at: _instance(m, kind, at))} for at in GRID]
    return found


def _answer(m: ModelSpec, read) -> dict[str, Any]:
    try:
        return read()
    except _Absent as e:
        return {"absent": str(e)}
    except _Raised as e:
        return {e.kind: {"step": e.step, "error": e.error}}
    except (ProbeError, NotImportable):
        raise
    except Exception as e:  # not a refusal the release states: the reader could not read it
        raise ProbeError(f"allocating model {m.name!r}: {type(e).__name__}: {e}") from e


def _instance(m: ModelSpec, kind: str, at: Sizing) -> dict[str, Any]:
    """Model `m` allocated at sizes `at`: the allocations (bytes each) and each attention layer's view, group and
    kernel block size (what the kernel checks draw; the connector's record is the one at RECORDED)."""
    with _model(m, kind, at) as (classes, vllm_config, specs):
        config, kernel, connector, bound, *_ = _allocated(m, classes, kind, vllm_config, specs)
    storages = _storages([*connector.values(), *bound.values()])
    return {"allocations": list(storages.values()), "layers": {
        name: {"group": gid, "kernel_block_size": _kernel_size(kernel, gid),
               "manager_block_size": group.kv_cache_spec.block_size,
               "layer": view_bytes(bound[name], list(storages).index(bound[name].untyped_storage().data_ptr()))}
        for gid, group in enumerate(config.kv_cache_groups) for name in group.layer_names
        if isinstance(m.layers[name].backend, str) and isinstance(bound.get(name), torch.Tensor)}}


@contextlib.contextmanager
def planned(name: str) -> Iterator[tuple[Any, Any]]:
    """Model `name` (of MODELS) planned by the release as `allocation` plans it, and in force as in vLLM's worker
    while a KV connector of it is built and driven: (the release's VllmConfig, current, its KV cache layout
    resolved; the release's own KVCacheConfig of the model), fresh each time. ProbeError where the release has no
    such model or refused it."""
    m = next((x for x in MODELS if x.name == name), None)
    if m is None:
        raise ProbeError(f"no model {name!r} (models: {', '.join(x.name for x in MODELS)})")
    kind, what = era()
    if kind is None:
        raise ProbeError(f"the whole-model allocation is not read for this release: {what}")
    with contextlib.ExitStack() as stack:
        try:
            classes, vllm_config, specs = stack.enter_context(_model(m, kind))
            config = _planned(m, classes, kind, vllm_config, specs)[1]
        except (_Absent, _Raised) as e:
            raise ProbeError(f"model {name!r}: {e}") from e
        yield vllm_config, config


class _Absent(Exception):
    """The release has no such thing (a backend, a cache dtype)."""


@contextlib.contextmanager
def _model(m: ModelSpec, kind: str, at: Sizing = RECORDED) -> Iterator[tuple[dict[Any, type], Any, dict[str, Any]]]:
    """In force while model `m` is planned and allocated at sizes `at` (its backends' classes importable, the layout
    setting of its allocation, the release's current VllmConfig): (its backends' classes, that VllmConfig, its layers'
    specs as the model runner hands them to the planner, shared layers left out). _Absent where the release lacks
    one."""
    iface, config_mod = module(IFACE), module("vllm.config")
    if m.cache_dtype != "auto" and not hasattr(iface, "get_kv_quant_mode"):
        raise _Absent(f"no cache dtype {m.cache_dtype} ({IFACE} has no get_kv_quant_mode)")
    with contextlib.ExitStack() as stack:
        classes = {}
        for b in dict.fromkeys(layer.backend for layer in m.layers.values()):  # in the model's order
            cls = stack.enter_context(_backend_class(b))
            if cls is None:
                raise _Absent(f"no backend {b if isinstance(b, str) else '.'.join(b)} in this release")
            classes[b] = cls
        # Layers interleaved per block: a layout the user sets on the free allocator's releases, a KV connector
        # preferring cross-layer blocks on the runner's.
        stack.enter_context(layout_env(CROSS_LAYER_LAYOUT if m.cross_layer and kind == "free" else None))
        vllm_config = config_mod.VllmConfig(
            cache_config=config_mod.CacheConfig(block_size=m.block_size * at.block_scale,
                                                num_gpu_blocks_override=at.num_blocks,
                                                cache_dtype=m.cache_dtype),
            device_config=config_mod.DeviceConfig(device="cpu"))
        # The CPU platform turns the hybrid KV-cache manager off; a CUDA one, which this models, keeps it on.
        vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = False
        with config_mod.set_current_vllm_config(vllm_config):
            with _step("spec"):
                specs = {n: layer.spec(iface, classes[layer.backend], at) for n, layer in m.layers.items()
                         if layer.shares is None}
            yield classes, vllm_config, specs


@contextlib.contextmanager
def _backend_class(b: str | tuple[str, str]) -> Iterator[type | None]:
    if isinstance(b, str):
        with backend(backend_named(b)) as (_, cls, _stubbed):
            yield cls
    else:
        mod = module(b[0])
        yield getattr(mod, b[1], None) if mod is not None else None


REFUSALS = (ValueError, AssertionError, NotImplementedError)  # how vLLM refuses a configuration


class _Raised(Exception):
    """A step of the release raised: "refused" where it raised one of REFUSALS, "raised" (it broke) otherwise."""

    def __init__(self, step: str, e: BaseException):
        self.kind = "refused" if isinstance(e, REFUSALS) else "raised"
        self.step, self.error = step, f"{type(e).__name__}: {e}".strip()

    def __str__(self) -> str:
        return f"{self.kind} at {self.step}: {self.error}"


@contextlib.contextmanager
def _step(name: str) -> Iterator[None]:
    """One call into the release: what it raises is its answer for this model, but a TypeError (a call this reader
    got wrong for the release: a ProbeError)."""
    try:
        yield
    except TypeError:
        raise
    except Exception as e:  # noqa: BLE001 - kept with the step and the message
        raise _Raised(name, e) from e


def _plan_and_allocate(m: ModelSpec, kind: str):
    with _model(m, kind) as (classes, vllm_config, specs):
        config, kernel, connector, bound, cross, layout, bind = _allocated(m, classes, kind, vllm_config, specs)
        managers = [g.kv_cache_spec.block_size for g in config.kv_cache_groups][:len(kernel)]
        # Where a group is split, the same allocation without splitting gives each layer its manager blocks' bytes.
        unsplit = bind(managers)[1] if managers != list(kernel) else bound
        return {"layout": layout if isinstance(layout, str) else layout.name, "num_blocks": config.num_blocks,
                "groups": [_group_record(g, _kernel_size(kernel, i)) for i, g in enumerate(config.kv_cache_groups)],
                "tensors": [_tensor_record(t) for t in config.kv_cache_tensors],
                **_layer_records(m, config, kernel, connector, bound, unsplit, cross)}


def _allocated(m: ModelSpec, classes: dict[Any, type], kind: str, vllm_config, specs: dict[str, Any]):
    """Model `m` planned and allocated: (the release's KVCacheConfig, its kernel block sizes, the connector's dict,
    the layers' dict, the cross-layer tensor or None, the layout, the binding at any kernel block sizes)."""
    worker = module(WORKER)
    layout, config, shared, runner_only = _planned(m, classes, kind, vllm_config, specs)
    attn_groups = [_attention_groups(worker, m, classes, g, gid) for gid, g in enumerate(config.kv_cache_groups)]
    own = getattr(worker, "prepare_kernel_block_sizes", None)  # before 0.18 the runner's own method
    with _step("prepare_kernel_block_sizes"):
        if own is not None:
            kernel = own(config, attn_groups)
        else:
            kernel = _runner_of(m, vllm_config, config, attn_groups, shared, runner_only, {}) \
                ._prepare_kernel_block_sizes(config)

    def bind(sizes: list[int]):
        if kind == "free":
            return _free(worker, config, attn_groups, layout, shared, sizes)
        return _runner(m, vllm_config, config, attn_groups, shared, runner_only, sizes)

    return config, kernel, *bind(kernel), layout, bind


def _planned(m: ModelSpec, classes: dict[Any, type], kind: str, vllm_config, specs: dict[str, Any]
             ) -> tuple[Any, Any, dict[str, str], set[str]]:
    """(the layout, the release's KVCacheConfig of model `m`, its shared layers and the layers they reuse, the shared
    layers the release lists as the runner's alone): the layout resolved first (the free allocator's releases plan
    in it), its planner's groups and config, then KV sharing added to the groups."""
    worker, planner = module(WORKER), _planner()
    layout = _resolve_layout(vllm_config, classes, specs) if kind == "free" else _layout_setting()
    shared = {n: layer.shares for n, layer in m.layers.items() if layer.shares is not None}
    with _step("get_kv_cache_groups"):
        groups = planner.get_kv_cache_groups(vllm_config, specs)
    with _step("get_kv_cache_config_from_groups"):
        plan = planner.get_kv_cache_config_from_groups
        # Through 0.11 it also takes the specs by layer.
        extra = {"kv_cache_specs": specs} if "kv_cache_specs" in inspect.signature(plan).parameters else {}
        config = plan(vllm_config, groups, available_memory=1 << 40, **extra)
    runner_only: set[str] = set()
    with _step("add_kv_sharing_layers_to_kv_cache_groups"):
        add = worker.add_kv_sharing_layers_to_kv_cache_groups
        if "runner_only_attn_layers" in inspect.signature(add).parameters:
            add(shared, config.kv_cache_groups, runner_only)
        else:
            add(shared, config.kv_cache_groups)
    return layout, config, shared, runner_only


def _resolve_layout(vllm_config, classes: dict[Any, type], specs: dict[str, Any]):
    utils = module(ATTN_UTILS)
    with _step("resolve_kv_cache_layout"):
        supported = utils.get_supported_kv_cache_layouts(list(dict.fromkeys(classes.values())))
        return utils.resolve_kv_cache_layout(vllm_config, [[x.name for x in supported]], list(specs.values()))


def _layout_setting() -> str:
    """The runner's releases: the layout setting the backends read (get_kv_cache_layout), "default" without one."""
    read = getattr(module(ATTN_UTILS), "get_kv_cache_layout", None)
    return f"{read()}" if read is not None else "default"


def _free(worker, config, attn_groups: list, layout, shared: dict[str, str], kernel: list[int]):
    """(the connector's dict, the layers' dict, None) from the free allocator at these kernel block sizes, bound as
    GPUModelRunner.initialize_kv_cache_tensors binds them."""
    with _step("allocate_kv_cache"):
        connector = worker.allocate_kv_cache(config, torch.device("cpu"), layout, kernel)
    for name, target in shared.items():
        connector[name] = connector[target]
    bind = getattr(worker, "map_kv_caches_to_kernel_blocks", None)
    with _step("map_kv_caches_to_kernel_blocks"):
        bound = bind(connector, [g for gs in attn_groups for g in gs]) if bind is not None else connector
    return connector, bound, None


class _Bound:
    """An attention module of the forward context, keeping the cache bind_kv_cache hands it (through its
    bind_kv_cache method, or by setting `kv_cache` to the tensor or to a one-item list, by release)."""

    def __init__(self) -> None:
        self.given: Cache | None = None

    def bind_kv_cache(self, kv_cache: Cache) -> None:
        self.given = kv_cache

    @property
    def kv_cache(self) -> Cache | None:
        return self.given

    @kv_cache.setter
    def kv_cache(self, value) -> None:
        # One item per virtual engine (`[cache]`) until 0.21; the cache itself from 0.22, a list where it is a Mamba
        # layer's states (two in these models, so a one-item list is never a layer's states).
        self.given = value[0] if isinstance(value, list) and len(value) == 1 else value


def _runner_of(m: ModelSpec, vllm_config, config, attn_groups: list, shared: dict[str, str], runner_only: set[str],
               context: dict[str, _Bound]):
    """A GPUModelRunner holding only what its KV-cache methods read, its forward context `context`."""
    runner = object.__new__(module(RUNNER).GPUModelRunner)
    vars(runner).update(
        device=torch.device("cpu"), vllm_config=vllm_config, cache_config=vllm_config.cache_config,
        model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type="kvconform")),
        compilation_config=types.SimpleNamespace(static_forward_context=context), kv_cache_config=config,
        attn_groups=attn_groups, runner_only_attn_layers=runner_only, shared_kv_cache_layers=dict(shared), kv_caches=[],
        cross_layers_kv_cache=None, cross_layers_attn_backend=None, speculative_config=None)
    return runner


def _runner(m: ModelSpec, vllm_config, config, attn_groups: list, shared: dict[str, str], runner_only: set[str],
            kernel: list[int]):
    """(the connector's dict, the layers' dict, the cross-layer tensor or None) from GPUModelRunner's own
    initialize_kv_cache_tensors at these kernel block sizes; a KV connector preferring cross-layer blocks stands in
    for one where the model asks for it."""
    context = {n: _Bound() for n in m.layers}
    runner = _runner_of(m, vllm_config, config, attn_groups, shared, runner_only, context)
    with _connector(m.cross_layer), _cuda_platform(), _step("initialize_kv_cache_tensors"):
        connector = runner.initialize_kv_cache_tensors(config, kernel)
    bound = {n: layer.given for n, layer in context.items() if layer.given is not None}
    cross = runner.cross_layers_kv_cache
    # With a cross-layer tensor the runner calls register_cross_layers_kv_cache in place of register_kv_caches.
    return connector if cross is None else {}, bound, cross


@contextlib.contextmanager
def _cuda_platform() -> Iterator[None]:
    """The platform answering bind_kv_cache as CUDA does, so that two caches of one layer index (an MLA layer's
    latent and indexer caches) are bound: its multi-layer check a no-op, or (older releases) it says CUDA."""
    platform = module(WORKER).current_platform
    with contextlib.ExitStack() as stack:
        for name, answer in (("check_runner_kv_caches_multi_layer", None), ("is_cuda_alike", True)):
            if hasattr(platform, name):
                stack.enter_context(patched(platform, name, lambda answer=answer: answer))
        yield


@contextlib.contextmanager
def _connector(cross_layer: bool) -> Iterator[None]:
    mixin = module(MIXIN)
    if not cross_layer or mixin is None:
        yield
        return
    stand_in = types.SimpleNamespace(prefer_cross_layer_blocks=True)
    with patched(mixin, "has_kv_transfer_group", lambda: True), \
            patched(mixin, "get_kv_transfer_group", lambda: stand_in):
        yield


def _attention_groups(worker, m: ModelSpec, classes: dict[Any, type], group, gid: int) -> list:
    """A cache group's attention groups as the runner forms them: one per backend, with its layers' spec."""
    fields = {f.name for f in dataclasses.fields(worker.AttentionGroup)}
    by_backend: dict[type, list[str]] = {}
    for name in group.layer_names:
        by_backend.setdefault(classes[m.layers[name].backend], []).append(name)
    return [worker.AttentionGroup(**{k: v for k, v in dict(
        backend=cls, layer_names=names, kv_cache_spec=_spec_of(group, names[0]), kv_cache_group_id=gid).items()
        if k in fields}) for cls, names in by_backend.items()]


def _kernel_size(kernel: list[int], gid: int) -> int | None:
    # As allocate_kv_cache reads prepare_kernel_block_sizes' list: a group past its end is not split.
    return kernel[gid] if gid < len(kernel) else None


def _spec_of(group, layer: str):
    spec = group.kv_cache_spec
    return spec.kv_cache_specs[layer] if hasattr(spec, "kv_cache_specs") else spec


def _group_record(group, kernel_block_size: int | None) -> dict[str, Any]:
    spec = group.kv_cache_spec
    return {"layers": list(group.layer_names), "spec": type(spec).__name__, "manager_block_size": spec.block_size,
            "kernel_block_size": kernel_block_size, "page_size_bytes": spec.page_size_bytes,
            "page_size_padded": getattr(spec, "page_size_padded", None)}


def _tensor_layers(t) -> list[str]:
    # `layers` where one tensor places several layers side by side (0.29 -), `shared_by` where they overlay it.
    return list(t.layers if hasattr(t, "layers") else t.shared_by)


def _tensor_record(t) -> dict[str, Any]:
    fields = ("size", "offset", "layer_stride", "block_stride")
    return {"layers": _tensor_layers(t), **{f: getattr(t, f) for f in fields if hasattr(t, f)}}


def view_bytes(t: torch.Tensor, allocation: int) -> dict[str, Any]:
    """A view's geometry in bytes from the start of its allocation: shape, strides, offset, and the span
    [first byte, last byte + 1) it can address."""
    size = t.element_size()
    stride = [s * size for s in t.stride()]
    offset = t.storage_offset() * size
    end = offset + sum((n - 1) * s for n, s in zip(t.shape, stride, strict=True)) + size if t.numel() else offset
    return {"allocation": allocation, "shape": list(t.shape), "stride_bytes": stride, "offset_bytes": offset,
            "span": [offset, end], "dtype": str(t.dtype).removeprefix("torch.")}


def _touched(t: torch.Tensor) -> torch.Tensor:
    """A mask of its allocation's bytes that `t` addresses."""
    size = t.element_size()
    mask = torch.zeros(t.untyped_storage().nbytes(), dtype=torch.bool)
    stride = (*(s * size for s in t.stride()), 1)
    torch.as_strided(mask, (*t.shape, size), stride, t.storage_offset() * size).fill_(True)
    return mask


def _states(cache: Cache) -> list[torch.Tensor]:
    return list(cache) if isinstance(cache, (list, tuple)) else [cache]


def _layer_records(m: ModelSpec, config, kernel: list[int], connector: dict[str, Cache], bound: dict[str, Cache],
                   unsplit: dict[str, Cache], cross: torch.Tensor | None) -> dict[str, Any]:
    """The allocations (bytes each), per layer what it and the connector are handed and which layers address any of
    its bytes, and the cross-layer tensor a connector is handed instead of the dict (None: none)."""
    missing = sorted(set(m.layers) - set(bound))
    if missing:
        raise ProbeError(f"no cache was bound to {', '.join(missing)}")
    storages = _storages([*connector.values(), *bound.values()] + ([cross] if cross is not None else []))
    index = {ptr: i for i, ptr in enumerate(storages)}

    def where(t: torch.Tensor) -> int:
        return index[t.untyped_storage().data_ptr()]

    def views(cache: Cache) -> dict[str, Any] | list[dict[str, Any]]:
        found = [view_bytes(t, where(t)) for t in _states(cache)]
        return found if isinstance(cache, (list, tuple)) else found[0]

    touched = {n: [(where(t), _touched(t)) for t in _states(bound[n])] for n in m.layers}

    def overlap(a: str, b: str) -> bool:
        return any(x == y and bool((p & q).any()) for x, p in touched[a] for y, q in touched[b])

    layers = {}
    for gid, group in enumerate(config.kv_cache_groups):
        manager = group.kv_cache_spec.block_size
        for name in group.layer_names:
            layer, given = _states(bound[name])[0], connector.get(name)
            axis = _block_axis(m, name, layer, config.num_blocks, manager, _kernel_size(kernel, gid))
            whole = _states(unsplit[name])[0]
            layers[name] = {
                "group": gid,
                "shares": m.layers[name].shares,
                "layer": views(bound[name]),
                "connector": "the layer's tensor" if given is bound[name] else
                             "none: the connector gets the cross-layer tensor" if given is None else views(given),
                "manager_block_size": manager,
                "kernel_block_size": _kernel_size(kernel, gid),
                "block_axis": axis,
                "kernel_blocks": _kernel_blocks(layer, axis, whole,
                                                _block_axis(m, name, whole, config.num_blocks, manager, None)),
                "overlaps": sorted(o for o in m.layers if o != name and overlap(o, name)),
            }
    return {"allocations": list(storages.values()), "layers": layers,
            "cross_layer_tensor": view_bytes(cross, where(cross)) if cross is not None else None}


def _storages(caches: list[Cache]) -> dict[int, int]:
    """The allocations under `caches`, in the order met: data pointer -> bytes."""
    storages: dict[int, int] = {}
    for t in [s for c in caches for s in _states(c)]:
        storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
    return storages


def _block_axis(m: ModelSpec, name: str, layer: torch.Tensor, num_blocks: int, manager: int, kernel: int | None) -> int:
    """The axis of a layer's view that is as long as its kernel blocks (ProbeError where not exactly one is)."""
    count = num_blocks * (manager // (kernel or manager))
    found = [i for i, n in enumerate(layer.shape) if n == count]
    if len(found) != 1:
        raise ProbeError(f"model {m.name!r} {name}: view of shape {tuple(layer.shape)} has {len(found)} axes of "
                         f"{count} kernel blocks ({num_blocks} manager blocks of {manager} tokens, kernel {kernel})")
    return found[0]


def _kernel_blocks(layer: torch.Tensor, axis: int, manager: torch.Tensor, manager_axis: int) -> list[list[int]]:
    """Per manager block (of the unsplit view), the layer's kernel blocks whose bytes all lie in it."""
    owned = [_touched(manager.select(manager_axis, b)) for b in range(manager.shape[manager_axis])]
    kernel = [_touched(layer.select(axis, k)) for k in range(layer.shape[axis])]
    return [[k for k, bytes_ in enumerate(kernel) if bool(bytes_[mine].sum() == bytes_.sum())] for mine in owned]
