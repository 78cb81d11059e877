"""What a subject sees of a vLLM release's layout API: live, vLLM's own classes; in replay, stand-ins built from the
release's recording (fixtures/contracts/<release>.json, field `api`).

- `surface`: what the probe records (names, kinds, signatures, answers at several argument sets) and its typed view.
- `standins`: per release, backend classes, layout functions and the KVCacheLayout enum with exactly the recorded
  surface, answering from the recording's model (contracts for sizes, recorded answers over finite domains);
  CannotAnswer where the model has no answer, the release's own exception type where it refused; `api_of` and
  `stand_ins` (built once per recording and device class).
- `modules`: `replaying(recording)` installs one release's stand-ins as importable `vllm...` modules for a scope.

Axis letters are harness.contract's. `backend_class(release, backend)` is the class a KV-cache consumer would get
for (release, backend): live vLLM's (when the installed release is `release`), else the stand-in. A recording made
before the probe kept the API (no `api` field) loads, but has no stand-ins: ApiError names its file and
the command that re-records it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from harness.backends import BACKENDS, backend_named
from harness.recordings import store
from harness.recordings.store import Recording
from harness.vllm_api.modules import ReplayError, real_vllm, replaying
from harness.vllm_api.standins import CannotAnswer, StandIns, api_of, stand_ins
from harness.vllm_api.surface import Api, ApiError

__all__ = ["Api", "ApiError", "CannotAnswer", "ReplayError", "StandIns", "api_of", "backend_class", "replaying",
           "stand_ins"]


def backend_class(release: str | Recording, backend: str, device: str | None = None) -> Any:
    """The backend class a connector gets for (release, backend) — kvconform's backend name, e.g. FLASH_ATTN: live
    (the installed vLLM is `release`), vLLM's own class; otherwise the recorded release's stand-in."""
    name = release.release if isinstance(release, Recording) else release
    if real_vllm():
        installed = importlib.metadata.version("vllm")
        if name not in (installed, "main"):
            raise ApiError(f"vLLM {installed} is installed, not {name}: its classes cannot stand for {name}'s")
        b = backend_named(backend)
        if b is None:
            raise ApiError(f"unknown backend {backend!r}; known: {', '.join(b.name for b in BACKENDS)}")
        return getattr(importlib.import_module(b.path), b.cls)
    rec = release if isinstance(release, Recording) else store.load(name)
    return stand_ins(rec, device).backend(backend)
