"""Importing a release's modules on a CPU host: a module the release does not have is None, a GPU library a backend
module needs (GPU_LIBRARIES) that is absent or broken here is served as a stub while the backend is read, and the
platform's device query answers for a chosen device class."""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Iterator

from harness.backends import Backend
from harness.probe.observe import ProbeError, patched

GPU_LIBRARIES = ("flashinfer",)  # imported by a backend module, absent from some releases' CPU installs


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


class NotImportable(Exception):
    """A backend's module raised on import (a GPU library the probe stubs aside): the backend cannot be read."""


@contextlib.contextmanager
def backend(b: Backend) -> Iterator[tuple[types.ModuleType | None, type | None, str]]:
    """A backend's module and class (None where the release has none) and the GPU library stubbed to import it (""
    for none); the stub stays in place while the backend is read. NotImportable, naming the error, when importing
    raised."""
    with contextlib.ExitStack() as stack:
        try:
            try:
                mod, stubbed = module(b.path), ""
            except ProbeError as e:
                stubbed = (getattr(e.__cause__, "name", None) or "").split(".")[0]
                if stubbed not in GPU_LIBRARIES:
                    raise
                stack.enter_context(stubs(stubbed))
                mod = module(b.path)
        except Exception as e:  # noqa: BLE001 - any import failure, named
            err = e.__cause__ if isinstance(e, ProbeError) and e.__cause__ is not None else e
            raise NotImportable(f"importing {b.path} raised {type(err).__name__}: {err}") from e
        yield mod, getattr(mod, b.cls, None) if mod is not None else None, stubbed


def device(mod: types.ModuleType, cap: tuple[int, int]) -> contextlib.AbstractContextManager:
    """`mod`'s platform answering device queries as compute capability `cap` (where the module asks it)."""
    if not hasattr(mod, "current_platform"):
        return contextlib.nullcontext()
    platform = module("vllm.platforms.interface")
    stub = types.SimpleNamespace(get_device_capability=lambda *a, **k: platform.DeviceCapability(*cap),
                                 is_device_capability=lambda c: c == cap[0] * 10 + cap[1],
                                 is_device_capability_family=lambda c: c // 10 == cap[0])
    return patched(mod, "current_platform", stub)


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
