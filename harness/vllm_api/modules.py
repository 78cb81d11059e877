"""Scoped module paths for replay: while `replaying(recording)` is active, `import vllm...` (at import time or
inside a call) finds one recorded release's stand-in modules; afterwards no `vllm` module is left behind.

Installed per release: every backend module the probe read (`vllm.v1.attention.backends.flash_attn`, ...) with its
stand-in backend class and a placeholder for every other public name the release's module held (FlashAttentionImpl,
FlashAttentionMetadata, ...), the layout modules of harness.vllm_api.surface.MODULES the release had (the
KVCacheLayout enum, get_kv_cache_layout, ...), and their parent packages. Any other `vllm` module raises
ModuleNotFoundError saying replay lacks it. A placeholder can be imported, subclassed and annotated with; calling or
instantiating it, or calling its forward, raises ReplayError.

Where it cannot work: a module imported under one release keeps the objects it bound then (`from ... import X`
binds X once); `rebind(module)` swaps such globals for the active release's stand-ins of the same path and name,
but a class that subclassed a placeholder keeps that base (placeholders of every release behave alike). A real vLLM
importable in the process is never shadowed: `replaying` refuses.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

from harness.recordings.store import Recording
from harness.vllm_api.standins import stand_ins, token

_lock = threading.RLock()
_active: list[str] = []  # the release whose stand-ins are installed (at most one)
_origin: dict[int, tuple[Any, str, str]] = {}  # id(stand-in) -> (the stand-in, kept alive; module; name): rebind
_built: dict[tuple[int, str | None], dict[str, types.ModuleType]] = {}  # (recording's token, device) -> modules


class ReplayError(RuntimeError):
    """A replay placeholder was used for more than its name (called, instantiated, run)."""


class _PlaceholderMeta(type):
    def __call__(cls, *args, **kwargs):
        raise ReplayError(f"REPLAY of vLLM {cls._replay_release}: {cls._replay_path} is a placeholder; replay holds "
                          "only the layout API")


def placeholder(release: str, module: str, name: str) -> type:
    """A class standing for `module.name`: importable, subclassable; calling it or its forward raises."""

    def forward(self, *args, **kwargs):
        raise ReplayError(f"REPLAY of vLLM {release}: {module}.{name}.forward is vLLM's own code, which replay lacks")

    return _PlaceholderMeta(name, (), {"__module__": module, "__doc__": f"REPLAY placeholder for vLLM {release}'s "
                                       f"{module}.{name}", "_replay_release": release,
                                       "_replay_path": f"{module}.{name}", "forward": forward})


def build(recording: Recording, device: str | None = None) -> dict[str, types.ModuleType]:
    """The stand-in modules of `recording`'s release, by import path (nothing installed; built once per recording
    and device class)."""
    key = (token(recording), device)
    if key not in _built:
        _built[key] = _build(recording, device)
    return _built[key]


def _build(recording: Recording, device: str | None) -> dict[str, types.ModuleType]:
    s = stand_ins(recording, device)
    api = s.api
    release = api.release
    mods: dict[str, types.ModuleType] = {}

    def module(path: str) -> types.ModuleType:
        if path not in mods:
            m = types.ModuleType(path, f"REPLAY stand-in for vLLM {release}'s {path}")
            m.__spec__ = importlib.machinery.ModuleSpec(path, _Finder.loader, is_package=True)
            m.__path__ = []  # every stand-in module may have children
            m.__replay_release__ = release
            mods[path] = m
            if "." in path:
                parent, _, leaf = path.rpartition(".")
                setattr(module(parent), leaf, m)
        return mods[path]

    for b in api.backends.values():
        m = module(b.module)
        for n in b.module_names:
            setattr(m, n, placeholder(release, b.module, n))
            s.classes[n] = getattr(m, n)
    for b in api.backends.values():
        setattr(module(b.module), b.cls, s.backend(b.name))
    for path, body in api.modules.items():
        if body is None:
            continue
        m = module(path)
        for n in body.get("public", []):
            setattr(m, n, placeholder(release, path, n))
        for n, spec in (body.get("names") or {}).items():
            setattr(m, n, s.enums[n] if spec["kind"] == "enum" else s.function(path, n))
    for path, m in mods.items():
        for n, v in vars(m).items():
            if not n.startswith("_") and not isinstance(v, types.ModuleType):
                _origin[id(v)] = (v, path, n)
    return mods


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on sys.meta_path while replaying: a `vllm` module that is no stand-in is refused by name."""

    loader: Any = None

    def __init__(self, release: str, mods: dict[str, types.ModuleType]):
        self.release, self.mods = release, mods

    def find_spec(self, name, path, target=None):
        if name != "vllm" and not name.startswith("vllm."):
            return None
        if name in self.mods:
            return importlib.util.spec_from_loader(name, self, is_package=True)
        raise ModuleNotFoundError(f"REPLAY of vLLM {self.release} has no stand-in for {name} (replay holds the "
                                  f"layout API's modules: {', '.join(sorted(self.mods))})", name=name)

    def create_module(self, spec):
        return self.mods[spec.name]

    def exec_module(self, module) -> None:
        pass


_Finder.loader = _Finder("", {})


def replayed() -> str | None:
    """The release whose stand-ins are installed now, None outside `replaying`."""
    return _active[-1] if _active else None


def real_vllm() -> bool:
    """A real vLLM is importable in this process (its own modules, not stand-ins)."""
    return not _active and _vllm_importable()


@functools.cache
def _vllm_importable() -> bool:
    # Asked outside replay only (the stand-ins' finder would answer inside), and fixed for a process: nothing
    # installs a vLLM into a running one. A search of sys.path, once rather than per replayed call.
    return importlib.util.find_spec("vllm") is not None


@contextlib.contextmanager
def replaying(recording: Recording, rebind: tuple[types.ModuleType, ...] = (), device: str | None = None
              ) -> Iterator[dict[str, types.ModuleType]]:
    """`recording`'s release as importable `vllm` stand-in modules for the duration (one release at a time in a
    process; the same release may nest). `rebind`: modules imported earlier whose globals bound stand-ins of
    another release, rebound to this release's for the duration. `device`: the device class (e.g. "sm100") that
    device-dependent answers are given for; None answers as the probing CPU did."""
    with _lock:
        if _active and _active[-1] != recording.release:
            raise RuntimeError(f"replaying vLLM {recording.release} while vLLM {_active[-1]}'s stand-ins are "
                               "installed: one release at a time per process")
        if "vllm" in sys.modules and not _active:  # a vllm.* module is never imported without its package
            raise RuntimeError("vllm modules are already imported in this process: replay stand-ins cannot be "
                               "installed beside them")
        if not _active and _vllm_importable():
            raise RuntimeError("a real vLLM is importable here: replay stand-ins never shadow it (use vLLM's own "
                               "classes; harness.vllm_api.backend_class does)")
        mods = build(recording, device)
        finder = _Finder(recording.release, mods)
        saved = {k: sys.modules[k] for k in mods if k in sys.modules}
        sys.meta_path.insert(0, finder)
        sys.modules.update(mods)
        _active.append(recording.release)
        swapped = [_rebind(m, mods) for m in rebind]
        try:
            yield mods
        finally:
            for m, old in zip(rebind, swapped):
                vars(m).update(old)
            _active.pop()
            sys.meta_path.remove(finder)
            for k in mods:
                sys.modules.pop(k, None)
            sys.modules.update(saved)


def _rebind(module: types.ModuleType, mods: dict[str, types.ModuleType]) -> dict[str, Any]:
    """Point `module`'s globals that hold some release's stand-in at this release's (same path, same name)."""
    old = {}
    for n, v in list(vars(module).items()):
        _, path, name = _origin.get(id(v), (None, "", ""))
        if path not in mods or not hasattr(mods[path], name):
            continue
        new = getattr(mods[path], name)
        if new is not v:
            old[n] = v
            setattr(module, n, new)
    return old
