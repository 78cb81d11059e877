"""Devices: which GPU a test process uses, how many processes a run starts per GPU, the Triton settings every
process of a run shares, and whether a device is still usable after a subject's call.

A subject's kernel that reads past its cache on a GPU raises an asynchronous CUDA error that poisons the process's
CUDA context for good: every later call in that process fails, for no fault of its own. Only a new process
recovers, so the runner ends a poisoned test process after recording the culprit (see `poisoned`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from pathlib import Path

import torch

WORKERS_PER_GPU = 8  # one H200 is kept busy by ~8 processes preparing examples while others launch kernels


def gpus() -> int:
    """CUDA devices visible to this process (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def workers_per_gpu(option: int | None) -> int:
    """Test processes per GPU: the option, else KVCONFORM_WORKERS_PER_GPU, else WORKERS_PER_GPU."""
    value = option if option is not None else int(os.environ.get("KVCONFORM_WORKERS_PER_GPU", WORKERS_PER_GPU))
    if value < 1:
        raise ValueError(f"workers per GPU must be >= 1, got {value}")
    return value


def workers(option: int | None) -> int:
    """Test processes a run starts on this host: GPUs x workers_per_gpu(option) (0 without CUDA)."""
    return gpus() * workers_per_gpu(option) if gpus() else 0


def prepare_triton() -> None:
    """Triton's settings for a run, before any kernel module is imported: Triton picks its interpreter at
    @triton.jit time, and xdist workers and warm-up processes inherit this environment, so they all share one
    compile cache (across sessions too; CI caches the folder) and count their compiles the same way."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TRITON_CACHE_DIR", str(Path.home() / ".cache" / "kvconform" / "triton"))
    from harness.device.compiles import MANAGER  # after TRITON_INTERPRET: it imports triton

    os.environ.setdefault("TRITON_CACHE_MANAGER", MANAGER)
    if os.environ.get("TRITON_INTERPRET") == "1":
        unchecked_interpreter()
        language_patched_once_per_launch()
        language_shapes_kept()
        numpy_types_kept()


def unchecked_interpreter() -> None:
    """Triton's interpreter without its integer overflow checks. It works one out for every int32 add, sub and mul a
    kernel makes, then drops it: the assertion that would use it is a no-op outside debug mode (the interpreter's
    options never turn it on), as a compiled kernel outside debug mode has no such check. That was half of an
    interpreted kernel's time; the values computed are the same."""
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and getattr(options, "sanitize_overflow", False) and not options.debug:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def language_shapes_kept() -> None:
    """Triton's language types keeping what they make of a shape. Every interpreted op makes its result's block type
    and tensor, each unwrapping, validating and wrapping the shape again into new Triton tuples and constexprs: a
    third of an interpreted kernel's time. The first block type of a shape, and the first tensor of such a block
    type, are made as the language makes them; a later one takes their attributes but its element type (and the
    name it gives it) or its handle and type. They are equal values, never changed after they are made. A shape
    whose block type names itself otherwise than `<shape, element type>` is always made anew; left as it is where
    the language is not built this way."""
    import triton.language.core as core

    block, tensor = core.block_type, core.tensor
    if getattr(block.__init__, "shapes_kept", False) or not all(hasattr(core, n) for n in ("tuple", "_unwrap_shape")):
        return
    block_init, tensor_init = block.__init__, tensor.__init__
    blocks: dict[tuple, dict] = {}  # the shape as given -> a block type's attributes but its element type and name
    tensors: dict[int, dict] = {}  # id of a kept block shape -> a tensor's attributes but its handle, type, dtype
    names: dict[tuple, str] = {}  # (id of a kept block shape, element type) -> the block type's name

    def block_type_init(self, element_ty, shape):
        key = tuple(shape) if isinstance(shape, (list, core.tuple)) else None
        known = blocks.get(key) if key is not None else None
        if known is None:
            block_init(self, element_ty, shape)
            if key is not None and self.name == f"<{self.shape}, {element_ty}>":
                blocks[key] = {k: v for k, v in vars(self).items() if k not in ("element_ty", "name")}
                tensors[id(self.shape)] = {}
            return
        self.__dict__.update(known)
        self.element_ty = element_ty
        name = (id(self.shape), str(element_ty))
        self.name = names.get(name) or names.setdefault(name, f"<{self.shape}, {element_ty}>")

    def tensor_type_init(self, handle, type):
        known = tensors.get(id(type.shape)) if type.is_block() else None
        if not known:
            tensor_init(self, handle, type)
            if known is not None:  # the first tensor of a kept shape
                known.update({k: v for k, v in vars(self).items() if k not in ("handle", "type", "dtype")})
            return
        self.__dict__.update(known)
        self.handle, self.type, self.dtype = handle, type, type.scalar

    block_type_init.shapes_kept = True
    block.__init__, tensor.__init__ = block_type_init, tensor_type_init


def numpy_types_kept() -> None:
    """Triton's interpreter looking up the numpy type of a Triton type in one table. It builds its table of 18 numpy
    types again at each lookup, and most interpreted ops look one up. Left as it is where the interpreter is not
    built this way."""
    import triton.language as tl
    from triton.runtime import interpreter

    lookup = getattr(interpreter, "_get_np_dtype", None)
    if lookup is None or getattr(lookup, "kept", False):
        return
    table: dict = {}

    def np_dtype(tt_dtype):
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return lookup(scalar)
        found = table.get(scalar)
        return found if found is not None else table.setdefault(scalar, lookup(scalar))

    np_dtype.kept = True
    interpreter._get_np_dtype = np_dtype


def language_patched_once_per_launch() -> None:
    """Triton's interpreter patching each language module once per launch. A launch patches triton.language for the
    interpreter, restoring it at the launch's end; every nested @triton.jit call inside the launch (a kernel's
    helpers, tl.max, tl.sum, tl.cdiv) patches its modules again, walking all their members with inspect. Patching a
    module already patched in the same launch skips the builtins already replaced and sets equivalent values for the
    rest, so the repeat is skipped: 30% of an interpreted launch, the same values computed. Left as it is where
    the interpreter is not built this way."""
    from triton.runtime import interpreter

    patch, scope = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if patch is None or scope is None or not hasattr(scope, "restore") or getattr(patch, "once_per_launch", False):
        return
    import triton.language as tl

    patched: set[int] = set()  # ids of the language modules patched since the current launch began
    langs_of: dict[object, frozenset[int]] = {}
    restore = scope.restore

    def once(fn):
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                             if inspect.ismodule(v) and v in (tl, tl.core))
        if langs and langs <= patched:
            return scope()
        patching = patch(fn)
        patched.update(langs)
        return patching

    def restoring(self) -> None:
        if self._changes:  # a launch's own scope: nested calls' scopes are dropped unrestored, empty or not
            patched.clear()
        restore(self)

    once.once_per_launch = True
    interpreter._patch_lang = once
    scope.restore = restoring


def settle(worker: str | None, worker_count: int, starts_workers: bool) -> str:
    """This process's device (worker_device), made current unless the process only starts xdist workers (kernels
    launch on the current device). An xdist worker gets its share of the host's CPUs for torch's thread pool,
    which torch otherwise sizes for the whole host in every worker."""
    device = worker_device(worker)
    if device.startswith("cuda") and (worker or not starts_workers):
        torch.cuda.set_device(device)
    if worker:
        torch.set_num_threads(cpu_share(worker_count))
    return device


def cpu_share(workers: int) -> int:
    """The CPUs of this host's (this process's affinity) that each of `workers` processes may keep busy."""
    return max(1, len(os.sched_getaffinity(0)) // workers)


def share_blas(workers: object) -> None:
    """Before starting `workers` test processes (xdist's worker count; anything but a positive count starts none):
    numpy's BLAS (OpenBLAS) in each sized to its share of the CPUs, as `settle` sizes torch's, unless
    OPENBLAS_NUM_THREADS is set. The interpreter's dots run on numpy, whose OpenBLAS
    otherwise starts a thread per CPU in every worker, the workers' threads then waiting on each other: on 2 CPUs,
    two workers' kernel checks ran 2.3 to 2.9 times slower. OpenBLAS reads the variable as numpy loads it, so it is
    set in the process that starts the workers."""
    if isinstance(workers, int) and workers > 0:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(cpu_share(workers)))


def worker_device(worker: str | None) -> str:
    """The device of one test process: xdist worker gwN takes GPU N mod the GPU count; without xdist GPU 0; "cpu"
    without CUDA."""
    count = gpus()
    if not count:
        return "cpu"
    index = int(re.fullmatch(r"gw(\d+)", worker).group(1)) if worker else 0
    return f"cuda:{index % count}"


def poisoned(device: str) -> str | None:
    """None while `device` still runs work, else the error it now raises for any call (a sticky CUDA error)."""
    if not device.startswith("cuda"):
        return None
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except Exception as e:  # noqa: BLE001 - any failure here means the context is unusable
        return f"{type(e).__name__}: {e}".strip()
    return None
