"""The recorded layout API of a release: which names a KV-cache consumer may ask, how an answer is kept in JSON,
and the typed view (`Api`) that the stand-ins are built from. No vLLM import here: the probe uses it to record,
replay to read.

An answer is `{"call": method, "args": [...], "kwargs": {...}, <where>: ..., "result": value}` or, for a
refusal, `"raises": [exception type name, text]`; `where` holds what else the answer depends on: `env` (the
VLLM_KV_CACHE_LAYOUT setting, null: unset), `device` (a device class such as "sm100", null: the probing CPU),
`state` (class attributes set while asking: a diff-KV backend's `head_size_v`). Tuples and enum members are
tagged (`{"tuple": [...]}`, `{"enum": "KVCacheLayout.LBHNC"}`) so that a stand-in's answer compares equal with
the release's own, type included.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FORMAT = 1  # the `api` field's format; a recording without the field (or of another format) has no stand-ins

# Backend class members a consumer asks about its layout (the rest of a backend class is not layout API).
BACKEND_MEMBERS = (
    "get_name", "get_kv_cache_shape", "get_kv_cache_stride_order", "supported_kv_cache_layouts", "customize_spec",
    "get_required_kv_cache_layout", "supported_kv_cache_dtypes", "is_mla", "is_sparse", "head_size_v",
    "get_impl_cls",
)
FLAGS = ("get_name", "is_mla", "is_sparse", "get_required_kv_cache_layout")  # zero-argument: asked once each
DEVICE_CLASSES = ((9, 0), (10, 0))  # compute capabilities a backend may answer differently for (Hopper, Blackwell)

# Modules whose layout names a consumer imports, and the names of each that are layout API.
MODULES = {
    "vllm.v1.attention.backends.utils": ("get_kv_cache_layout", "set_kv_cache_layout"),
    "vllm.v1.kv_cache_layout": ("KVCacheLayout",),
    "vllm.v1.kv_cache_interface": ("compute_layout_strides", "create_kv_cache_views"),
    "vllm.attention.backends.abstract": (),
    "vllm.v1.attention.backend": (),
}


class ApiError(LookupError):
    """A recording holds no (or an unreadable) API surface for what was asked."""


def signature(obj: Any) -> str | None:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None


def describe(cls: type, name: str) -> dict[str, Any]:
    """One backend class member as recorded: its kind and signature, or a value's JSON form."""
    static = inspect.getattr_static(cls, name)
    if isinstance(static, staticmethod):
        return {"kind": "staticmethod", "signature": signature(getattr(cls, name))}
    if isinstance(static, classmethod):
        return {"kind": "classmethod", "signature": signature(getattr(cls, name))}
    if isinstance(static, property):
        return {"kind": "property"}
    if inspect.isfunction(static):
        return {"kind": "function", "signature": signature(static)}
    return {"kind": "value", "value": encode(getattr(cls, name))}


def describe_enum(cls: type[enum.Enum]) -> dict[str, Any]:
    props = [n for n, v in vars(cls).items() if isinstance(v, property) and not n.startswith("_")]
    return {"kind": "enum", "members": {m.name: encode(m.value) for m in cls},
            "properties": {n: {m.name: encode(getattr(m, n)) for m in cls} for n in props}}


def encode(x: Any) -> Any:
    """JSON form of an answer; TypeError naming it for a value with none (the probe must not record a guess)."""
    if isinstance(x, enum.Enum):
        return {"enum": f"{type(x).__name__}.{x.name}"}
    if isinstance(x, tuple):
        return {"tuple": [encode(v) for v in x]}
    if isinstance(x, list):
        return [encode(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, type):
        return {"class": x.__name__}
    raise TypeError(f"no JSON form for answer {x!r} of type {type(x).__name__}")


def answer(method: str, args: tuple, kwargs: dict[str, Any], where: dict[str, Any], fn: Callable[[], Any]
           ) -> dict[str, Any]:
    """Ask `fn()` and keep what it answered or how it refused."""
    out: dict[str, Any] = {"call": method, "args": list(args), "kwargs": dict(kwargs),
                           **{k: v for k, v in where.items()}}
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - a refusal is the release's answer
        out["raises"] = [type(e).__name__, str(e)]
        return out
    out["result"] = encode(got)  # outside the try: an answer without a JSON form is the probe's error
    return out


@dataclass(frozen=True)
class Member:
    """A recorded class member: kind, signature text (callables) or JSON value (plain attributes)."""

    name: str
    kind: str
    signature: str | None = None
    value: Any = None


@dataclass(frozen=True)
class BackendApi:
    """One backend's recorded layout API: where it lives, its members, the names its module holds, its answers."""

    name: str
    module: str
    cls: str
    members: dict[str, Member]
    module_names: tuple[str, ...]
    answers: tuple[dict[str, Any], ...] = field(compare=False)

    def answers_to(self, method: str) -> list[dict[str, Any]]:
        return [a for a in self.answers if a["call"] == method]


@dataclass(frozen=True)
class Api:
    """A release's recorded layout API: backends by kvconform's name, modules by import path (None: absent)."""

    release: str
    backends: dict[str, BackendApi]
    absent: dict[str, str]  # backend -> why there is no class (not in this release, or not importable)
    modules: dict[str, dict[str, Any] | None]

    @classmethod
    def from_json(cls, release: str, data: dict[str, Any] | None, where: str) -> Api:
        if not data:
            raise ApiError(f"{where} records no layout API (recorded before the probe kept it); re-record it with "
                           f"`nox -s probe -- {release}`")
        if data.get("format") != FORMAT:
            raise ApiError(f"{where} records layout API format {data.get('format')!r}, this kvconform reads "
                           f"{FORMAT}; re-record it with `nox -s probe -- {release}`")
        backends, absent = {}, {}
        for name, b in data["backends"].items():
            if not b.get("present"):
                absent[name] = f"vLLM {release} has no {name} backend"
            elif "error" in b:
                absent[name] = f"vLLM {release}'s {name} backend could not be read: {b['error']}"
            else:
                members = {n: Member(n, m["kind"], m.get("signature"), m.get("value")) for n, m in b["members"].items()}
                backends[name] = BackendApi(name, b["module"], b["class"], members, tuple(b["module_names"]),
                                            tuple(b["answers"]))
        return cls(release, backends, absent, dict(data["modules"]))

    def backend(self, name: str) -> BackendApi:
        if name in self.backends:
            return self.backends[name]
        raise ApiError(self.absent.get(name) or f"vLLM {self.release} records no backend {name!r}; recorded: "
                       f"{', '.join(self.backends)}")


def surface_diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """Readable differences between two recorded `api` fields: names, kinds, signatures, values, answers."""
    if not a or not b:
        return [] if a == b else ["layout API " + ("not recorded in the recording" if not a else "not probed live")]
    out = []
    for mod in sorted(a["modules"].keys() | b["modules"].keys()):
        x, y = a["modules"].get(mod), b["modules"].get(mod)
        if (x is None) != (y is None):
            out.append(f"module {mod}: {'gone' if y is None else 'new'}")
        elif x is not None and x["names"] != y["names"]:
            for n in sorted(x["names"].keys() | y["names"].keys()):
                if x["names"].get(n) != y["names"].get(n):
                    out.append(f"{mod}.{n}: {x['names'].get(n)} -> {y['names'].get(n)}")
    for name in sorted(a["backends"].keys() | b["backends"].keys()):
        x, y = a["backends"].get(name, {}), b["backends"].get(name, {})
        if "members" not in x or "members" not in y:
            if x.get("present") != y.get("present"):
                out.append(f"{name}: backend {'gone' if not y.get('present') else 'new'}")
            continue
        for n in sorted(x["members"].keys() | y["members"].keys()):
            if x["members"].get(n) != y["members"].get(n):
                out.append(f"{name}.{n}: {x['members'].get(n)} -> {y['members'].get(n)}")
        key = lambda ans: repr({k: v for k, v in ans.items() if k not in ("result", "raises")})  # noqa: E731
        old, new = {key(t): t for t in x["answers"]}, {key(t): t for t in y["answers"]}
        for k in sorted(old.keys() | new.keys()):
            p, q = old.get(k), new.get(k)
            if p is None or q is None:
                out.append(f"{name}: answer to {k} {'gone' if q is None else 'new'}")
            elif _said(p) != _said(q):
                out.append(f"{name}: {k}: {_said(p)} -> {_said(q)}")
    return out


def _said(ans: dict[str, Any]) -> Any:
    # A refusal is compared by its type: texts may carry addresses or counts that do not change the layout.
    return ("raises", ans["raises"][0]) if "raises" in ans else ans["result"]
