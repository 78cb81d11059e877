"""What a KV-cache consumer can call, release by release: each recording's layout API (the `api` field of
fixtures/contracts/<release>.json, harness.vllm_api.surface) against the recorded release before it, in matrix.toml's
order (harness.matrix.version_key).

Compared: the modules that hold layout names and those names (surface.MODULES: get_kv_cache_layout, KVCacheLayout,
create_kv_cache_views, ...), the backends and each backend's members (get_kv_cache_shape, get_kv_cache_stride_order,
head_size_v, ...). A name is new, gone, changes signature (a parameter gained or lost, a default, an annotation, the
return annotation, or a callable turned value), or changes value (a list gains or loses items: a backend's
supported_kv_cache_dtypes; an enum its members). Annotations are compared as a consumer reads them: quoted or not,
typing's spellings folded (`Tuple[int, ...]` is `tuple[int, ...]`, `Optional[X]` is `X | None`). Not compared: the
other public names of a module (every import it holds), and the recorded answers, whose layouts the contracts hold
(docs/contracts.md). A recording without the field (recorded before the probe kept it) is compared with nothing.

Standard library only, the recordings read as plain JSON: the report (harness.report) lists these changes without
torch. `python -m harness.recordings.store api-changes` prints them as the table of docs/releases.md.
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from harness.matrix import version_key

ROOT = Path(str(resources.files("harness") / "recorded" / "contracts"))  # shipped as package data
FORMAT = 1  # harness.vllm_api.surface.FORMAT: the `api` field this module reads
GONE, NEW, SIGNATURE, VALUE, UNREAD = KINDS = ("gone", "new", "signature", "value", "not read")
_CALLABLE = ("staticmethod", "classmethod", "function")
_TYPING = {"Tuple": "tuple", "List": "list", "Dict": "dict", "Set": "set", "FrozenSet": "frozenset", "Type": "type"}


def releases(root: Path = ROOT) -> list[str]:
    """Releases with a recorded contract file, in version order (`main` last)."""
    return sorted((p.stem for p in root.glob("*.json")), key=version_key)


def recorded(release: str, root: Path = ROOT) -> Any:
    """`release`'s recording as plain JSON; a ValueError naming the file when it is not JSON."""
    path = root / f"{release}.json"
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not a recording: invalid JSON ({e})") from None


def api(release: str, root: Path = ROOT) -> dict[str, Any] | None:
    """The `api` field of `release`'s recording (None: it has none, or one of another format); a ValueError naming
    the file when it is not JSON."""
    data = recorded(release, root)
    found = data.get("api") if isinstance(data, dict) else None
    return found if isinstance(found, dict) and found.get("format") == FORMAT else None


@dataclass(frozen=True)
class ApiChange:
    """One name a consumer calls that changed: a module's layout name (its full path), a module ("module PATH"), a
    backend ("backend NAME"), or a member of `backends` (the backends it changed alike in)."""

    kind: str  # one of KINDS
    name: str
    backends: tuple[str, ...] = ()
    detail: str = ""  # signature and value: how ("gains cache_dtype_str: str = 'auto'")


@dataclass(frozen=True)
class Step:
    """What changed from the recorded release `before` to `release`; `backends`: those both have (for "all")."""

    release: str
    before: str
    changes: tuple[ApiChange, ...]
    backends: tuple[str, ...] = ()


class _Fold(ast.NodeTransformer):
    """An annotation as a consumer reads it: a quoted one parsed, typing's spellings folded (Literal's strings stay)."""

    def visit_Constant(self, n: ast.Constant) -> ast.AST:
        if isinstance(n.value, str):
            try:
                return self.visit(ast.parse(n.value, mode="eval").body)
            except SyntaxError:
                pass
        return n

    def visit_Name(self, n: ast.Name) -> ast.AST:
        return ast.Name(_TYPING.get(n.id, n.id))

    def visit_Attribute(self, n: ast.Attribute) -> ast.AST:
        if isinstance(n.value, ast.Name) and n.value.id == "typing":
            return self.visit(ast.Name(n.attr))
        return self.generic_visit(n)

    def visit_Subscript(self, n: ast.Subscript) -> ast.AST:
        base = self.visit(n.value)
        name = base.id if isinstance(base, ast.Name) else ""
        if name == "Literal":
            return ast.Subscript(base, n.slice)
        args = [self.visit(a) for a in (n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice])]
        if name in ("Optional", "Union"):
            out = args[0]
            for a in args[1:] + ([ast.Constant(None)] if name == "Optional" else []):
                out = ast.BinOp(out, ast.BitOr(), a)
            return out
        return ast.Subscript(base, ast.Tuple(args) if isinstance(n.slice, ast.Tuple) else args[0])


def _text(node: ast.AST | None, plain: bool = True) -> str:
    return "" if node is None else ast.unparse(_Fold().visit(node) if plain else node)


def _parameters(signature: str) -> tuple[dict[str, tuple[str, str, str]], str] | None:
    """A signature's parameters (name -> kind, annotation, default) in order, and its return annotation; None when
    its text does not parse."""
    try:
        f = ast.parse(f"def f{signature}: pass").body[0]
    except SyntaxError:
        return None
    a = f.args
    out: dict[str, tuple[str, str, str]] = {}
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + a.defaults
    for i, (p, d) in enumerate(zip(positional, defaults)):
        out[p.arg] = ("positional-only" if i < len(a.posonlyargs) else "", _text(p.annotation), _text(d, False))
    if a.vararg:
        out["*" + a.vararg.arg] = ("", _text(a.vararg.annotation), "")
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out[p.arg] = ("keyword-only", _text(p.annotation), _text(d, False))
    if a.kwarg:
        out["**" + a.kwarg.arg] = ("", _text(a.kwarg.annotation), "")
    return out, _text(f.returns)


def _parameter(name: str, kind: str, annotation: str, default: str) -> str:
    return (f"{kind} " if kind else "") + name + (f": {annotation}" if annotation else "") + (
        f" = {default}" if default else "")


def signature_changes(a: str | None, b: str | None) -> list[str]:
    """How a callable's signature text `a` became `b`, one entry per change (none: the same call)."""
    pa, pb = _parameters(a or ""), _parameters(b or "")
    if pa is None or pb is None:
        return [] if a == b else [f"{a} → {b}"]
    (x, ret_a), (y, ret_b) = pa, pb
    out = [f"gains {_parameter(n, *y[n])}" for n in y if n not in x]
    out += [f"loses {n}" for n in x if n not in y]
    for n in (n for n in x if n in y):
        (ka, ta, da), (kb, tb, db) = x[n], y[n]
        out += [f"parameter {n}: {ka or 'positional'} → {kb or 'positional'}"] if ka != kb else []
        out += [f"parameter {n}: {ta or 'unannotated'} → {tb or 'unannotated'}"] if ta != tb else []
        out += [f"parameter {n} default: {da or 'none'} → {db or 'none'}"] if da != db else []
    common = [n for n in x if n in y]
    if common != [n for n in y if n in x]:
        out.append(f"parameters reordered: ({', '.join(common)}) → ({', '.join(n for n in y if n in x)})")
    out += [f"returns {ret_a or 'unannotated'} → {ret_b or 'unannotated'}"] if ret_a != ret_b else []
    return out


def _value_changes(a: Any, b: Any) -> list[str]:
    if isinstance(a, list) and isinstance(b, list):
        gained = [v for v in b if v not in a]
        lost = [v for v in a if v not in b]
        out = [f"gains {', '.join(map(str, gained))}"] if gained else []
        out += [f"loses {', '.join(map(str, lost))}"] if lost else []
        return out or ([f"reordered: {a} → {b}"] if a != b else [])
    return [] if a == b else [f"{json.dumps(a)} → {json.dumps(b)}"]


def member_changes(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, str] | None:
    """How one recorded name (its kind, signature or value, as surface.describe keeps it) changed: (kind of change,
    how), or None."""
    if a["kind"] != b["kind"] and not (a["kind"] in _CALLABLE and b["kind"] in _CALLABLE):
        return SIGNATURE, f"{a['kind']} → {b['kind']}"  # a static method turned class method is called alike
    if a["kind"] in _CALLABLE:
        kind, found = SIGNATURE, signature_changes(a.get("signature"), b.get("signature"))
    elif a["kind"] == "enum":
        kind = VALUE
        found = [f"members {d}" for d in _value_changes(list(a["members"]), list(b["members"]))]
        found += [f"properties {d}" for d in _value_changes(list(a["properties"]), list(b["properties"]))]
        moved = sorted(m for m in a["members"].keys() & b["members"].keys() if a["members"][m] != b["members"][m]
                       or any(a["properties"].get(p, {}).get(m) != b["properties"].get(p, {}).get(m)
                              for p in a["properties"].keys() & b["properties"].keys()))
        found += [f"member values change: {', '.join(moved)}"] if moved else []
    else:
        kind, found = VALUE, _value_changes(a.get("value"), b.get("value"))
    return (kind, " and ".join(found)) if found else None


def _names(modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{m}.{n}": d for m, body in modules.items() if body for n, d in body["names"].items()}


def step(before: str, release: str, a: dict[str, Any], b: dict[str, Any]) -> Step:
    """What changed from `before`'s `api` field `a` to `release`'s `b`: modules and their layout names, then backends
    and their members (a member that changed alike in several backends is one change naming them)."""
    out: list[ApiChange] = []
    for m in [*a["modules"], *(m for m in b["modules"] if m not in a["modules"])]:
        x, y = a["modules"].get(m), b["modules"].get(m)
        if (x is None) != (y is None):
            out.append(ApiChange(GONE if y is None else NEW, f"module {m}"))
    names_a, names_b = _names(a["modules"]), _names(b["modules"])
    out += [ApiChange(GONE, n) for n in names_a if n not in names_b]
    out += [ApiChange(NEW, n) for n in names_b if n not in names_a]
    out += [ApiChange(changed[0], n, (), changed[1]) for n in names_a if n in names_b
            if (changed := member_changes(names_a[n], names_b[n]))]
    order = [*b["backends"], *(n for n in a["backends"] if n not in b["backends"])]
    both: list[str] = []
    by: dict[tuple[str, str, str], list[str]] = defaultdict(list)  # (kind, member, detail) -> backends
    for name in order:
        x, y = a["backends"].get(name, {}), b["backends"].get(name, {})
        if bool(x.get("present")) != bool(y.get("present")):
            out.append(ApiChange(NEW if y.get("present") else GONE, f"backend {name}"))
            continue
        if not x.get("present"):
            continue
        if "error" in x or "error" in y:
            out.append(ApiChange(UNREAD, f"backend {name}", (), (y if "error" in y else x)["error"]))
            continue
        both.append(name)
        ma, mb = x["members"], y["members"]
        for n in [*ma, *(n for n in mb if n not in ma)]:
            if n not in mb or n not in ma:
                by[(GONE if n not in mb else NEW, n, "")].append(name)
            elif changed := member_changes(ma[n], mb[n]):
                by[(changed[0], n, changed[1])].append(name)
    out += [ApiChange(kind, n, tuple(bs), d) for (kind, n, d), bs in by.items()]
    return Step(release, before, tuple(out), tuple(both))


def history(root: Path = ROOT, among: list[str] | None = None) -> list[Step]:
    """Per recorded release (of `among` only, when given) that has a recorded release before it, what changed from
    that one, in version order; releases whose layout API did not change included (no changes)."""
    recorded = releases(root)
    out = []
    for before, release in zip(recorded, recorded[1:]):
        if among is not None and release not in among:
            continue
        a, b = api(before, root), api(release, root)
        if a is not None and b is not None:
            out.append(step(before, release, a, b))
    return out


def _item(c: ApiChange) -> str:
    name = f"{c.backends[0]}.{c.name}" if len(c.backends) == 1 else c.name
    return f"{name} {c.detail}" if c.detail and c.kind != UNREAD else name + (f" ({c.detail})" if c.detail else "")


def said(step: Step, kind: str) -> str:
    """A step's changes of one kind in a line: names of the same backends grouped, `(all N backends)` where every
    backend both releases have changed alike; "" for none."""
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for c in step.changes:
        if c.kind == kind:
            groups[c.backends if len(c.backends) > 1 else ()].append(_item(c))
    out = []
    for backends, items in groups.items():
        where = ""
        if backends:
            where = (f" (all {len(backends)} backends)" if set(backends) == set(step.backends)
                     else f" ({', '.join(backends)})")
        out.append(", ".join(items) + where)
    return "; ".join(out)


def summary(step: Step) -> str:
    """A step in one line: `gone: ...; new: ...; signature: ...` (the kinds it has, in KINDS' order)."""
    return " · ".join(f"{kind}: {text}" for kind in KINDS if (text := said(step, kind)))


def table(root: Path = ROOT) -> str:
    """Markdown: one row per recorded release whose layout API differs from the release before, a column per kind of
    change; then the releases whose layout API is that of the release before."""
    steps = history(root)
    kinds = [k for k in KINDS if k != UNREAD or any(c.kind == UNREAD for s in steps for c in s.changes)]
    rows = ["| release | against | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for s in steps:
        if s.changes:
            rows.append(f"| {s.release} | {s.before} | "
                        + " | ".join(said(s, k).replace("|", "\\|").replace("; ", "<br>") or "—" for k in kinds)
                        + " |")
    same = [s.release for s in steps if not s.changes]
    return "\n".join(rows) + (f"\n\nThe same as the release before: {', '.join(same)}." if same else "")
