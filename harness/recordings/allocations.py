"""What each release allocates for a whole model, as recorded (`observations["allocations"]` of
fixtures/contracts/<release>.json, written by harness.probe.allocation): one readable cell per release and model,
what changed between consecutive releases, and the drift between a recording and a live probe.

Standard library only, the recordings read as plain JSON. `python -m harness.recordings.store allocations` prints the
tables of docs/releases.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.recordings.api_history import ROOT, recorded, releases

UNCOMPARED = ("about",)  # kvconform's words for a model, not the release's answer
GRID = "instances"  # a model's K/V layers' views at the probe's grid of sizes
READERS = ("planner", "allocator", "layers_get")  # which of the release's functions planned, allocated, bound


def recordings(root: Path = ROOT) -> list[tuple[str, dict[str, Any]]]:
    """(release, recording as JSON) in version order; a ValueError naming the file that is not JSON."""
    return [(name, recorded(name, root)) for name in releases(root)]


def cell(model: dict[str, Any]) -> str:
    """One model's allocation in a few words: the layout, then each thing a consumer must know about it."""
    for kind in ("refused", "raised"):
        if kind in model:
            return f"{kind} at {model[kind]['step']} ({model[kind]['error'].split(':')[0]})"
    if "absent" in model:
        return "n/a (" + model["absent"] + ")"
    layers = model["layers"].values()
    n, a = len(model["groups"]), len(model["allocations"])
    words = [model["layout"], f"{n} group{'s' * (n != 1)}" + (f" in {a} allocations" if a != 1 else "")]
    groups = {name: layer["group"] for name, layer in model["layers"].items()}
    if any(groups[o] != layer["group"] for layer in layers for o in layer["overlaps"]):
        words.append("groups overlaid")
    if any(layer["shares"] for layer in layers):
        words.append("shared layers")
    splits = sorted({(layer["kernel_block_size"], layer["manager_block_size"]) for layer in layers
                     if layer["kernel_block_size"] != layer["manager_block_size"]})
    words += [f"kernel blocks of {k} in manager blocks of {m}" for k, m in splits]
    if any(g["page_size_padded"] is not None for g in model["groups"]):
        words.append("padded pages")
    if interleaved(model["layers"]):
        words.append("layers interleaved per block")
    if model.get("cross_layer_tensor"):
        words.append("the connector gets one cross-layer tensor")
    elif any(layer["connector"] != "the layer's tensor" for layer in layers):
        words.append("connector views differ from layer views")
    return ", ".join(words)


def views(layer: dict[str, Any]) -> list[dict[str, Any]]:
    """The views a layer was handed: one, or one per state tensor (a Mamba layer of the runner's releases)."""
    given = layer["layer"]
    return given if isinstance(given, list) else [given]


def interleaved(layers: dict[str, Any]) -> bool:
    """Two layers of one allocation whose byte ranges cross although no byte is shared."""
    spans = [(name, v) for name, layer in layers.items() for v in views(layer)]
    return any(x != y and a["allocation"] == b["allocation"] and x not in layers[y]["overlaps"]
               and a["span"][0] < b["span"][1] and b["span"][0] < a["span"][1]
               for i, (x, a) in enumerate(spans) for y, b in spans[i + 1:])


def kernel_rule(blocks: list[list[int]]) -> str:
    """The rule a layer's kernel blocks follow: "k = m*R + j, j < R" when manager block m holds exactly those."""
    ratio = len(blocks[0]) if blocks else 0
    if ratio and all(b == list(range(m * ratio, (m + 1) * ratio)) for m, b in enumerate(blocks)):
        return "k = m" if ratio == 1 else f"k = m*{ratio} + j, j < {ratio}"
    return "irregular: " + "; ".join(f"{m}: {b}" for m, b in enumerate(blocks))


def read(recording: dict[str, Any]) -> dict[str, Any] | None:
    """A recording's allocations where the probe read them (None: not recorded, or not read for this release)."""
    found = recording.get("observations", {}).get("allocations")
    return found if found and found.get("read") else None


def table(recs: list[tuple[str, dict[str, Any]]] | None = None) -> str:
    """Markdown: per model, the runs of consecutive releases that allocate it alike, each with its cell; then what
    each release refused or raised, and the releases not read, with why."""
    recs = recordings() if recs is None else recs
    read_ = [(name, a) for name, rec in recs if (a := read(rec)) is not None]
    models = list(dict.fromkeys(m for _, a in read_ for m in a["models"]))
    lines = ["| model | releases | what a layer and the connector get |", "|---|---|---|"]
    for m in models:
        runs: list[tuple[list[str], str]] = []
        for name, a in read_:
            said = cell(a["models"][m]) if m in a["models"] else "not recorded"
            if runs and runs[-1][1] == said:
                runs[-1][0].append(name)
            else:
                runs.append(([name], said))
        lines += [f"| {m} | {_span(names)} | {said} |" for names, said in runs]
    said_: dict[str, list[str]] = {}
    for name, a in read_:
        for m, model in a["models"].items():
            for kind in ("refused", "raised"):
                if kind in model:
                    said_.setdefault(f"{m} {kind} at {model[kind]['step']}: {model[kind]['error']}", []).append(name)
    lines += [""] + [f"- {_span(names)}: {what}" for what, names in said_.items()]
    unread: dict[str, list[str]] = {}
    for name, rec in recs:
        found = rec.get("observations", {}).get("allocations")
        if read(rec) is None:
            unread.setdefault(found.get("why", "no reason recorded") if found else "not recorded", []).append(name)
    lines += [""] + [f"Not read for {', '.join(names)}: {why}." for why, names in unread.items()]
    return "\n".join(lines)


def _span(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} – {names[-1]}"


def changes(recs: list[tuple[str, dict[str, Any]]] | None = None) -> str:
    """Markdown: per release, what its allocations changed from the release before it (both read): the reading
    functions, each model whose cell changed, and for a model whose cell stayed, how many recorded facts moved (at
    the recorded sizes: the views at the grid's sizes, `instances`, are the kernel checks')."""
    recs = recordings() if recs is None else recs
    out, before = [], None
    for name, rec in recs:
        now = read(rec)
        if now is not None and before is not None:
            lines = _changed(before[1], now)
            out.append(f"- **{name}** (from {before[0]}): " + ("; ".join(lines) if lines else "no change"))
        elif now is not None:
            out.append(f"- **{name}**: the first release read at this level")
        before = (name, now) if now is not None else before
    return "\n".join(out)


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = [f"{key} {old.get(key)} → {new.get(key)}" for key in READERS if old.get(key) != new.get(key)]
    for m in dict.fromkeys([*old["models"], *new["models"]]):
        a, b = old["models"].get(m), new["models"].get(m)
        if a is None or b is None:
            out.append(f"{m} {'new' if a is None else 'gone'}")
        elif cell(a) != cell(b):
            out.append(f"{m}: {cell(a)} → {cell(b)}")
        else:
            moved = _moved(*({k: v for k, v in _comparable(x).items() if k != GRID} for x in (a, b)))
            if moved:
                out.append(f"{m}: {len(moved)} recorded fact{'s' * (len(moved) != 1)} moved "
                           f"({', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''})")
    return out


def diff(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    """Readable differences between two allocation records, one line per changed fact, named by model and path
    (`kernel-split layers.layers.0.kernel_block_size: 64 -> 16`)."""
    if (old or {}).get("read") != (new or {}).get("read") or not (old or {}).get("read"):
        a, b = _state(old), _state(new)
        return [] if a == b else [f"whole-model allocations: {a} -> {b}"]
    out = [f"{key} {old.get(key)} -> {new.get(key)}" for key in READERS if old.get(key) != new.get(key)]
    for model in sorted(old["models"].keys() | new["models"].keys()):
        a, b = old["models"].get(model), new["models"].get(model)
        if a is None or b is None:
            out.append(f"{model}: {'new' if a is None else 'gone'}")
            continue
        if _kind(a) != _kind(b):  # allocated, refused, raised or absent: one line says it
            out.append(f"{model}: {_answer(a)} -> {_answer(b)}")
            continue
        out += [f"{model} {line}" for line in _flat_diff(_comparable(a), _comparable(b))]
    return out


def _kind(model: dict[str, Any]) -> str:
    return next((k for k in ("refused", "raised", "absent") if k in model), "allocated")


def _answer(model: dict[str, Any]) -> str:
    kind = _kind(model)
    if kind in ("refused", "raised"):
        return f"{kind} at {model[kind]['step']}: {model[kind]['error']}"
    return cell(model)


def _state(a: dict[str, Any] | None) -> str:
    if not a:
        return "not recorded"
    return "read" if a.get("read") else f"not read ({a.get('why')})"


def _comparable(model: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in model.items() if k not in UNCOMPARED}


NONE = "(none)"


def _differing(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(path, old, new) for each fact that differs: dicts are compared key by key, anything else whole."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a.keys() | b.keys(), key=str)
                for d in _differing(a.get(k, NONE), b.get(k, NONE), f"{path}.{k}" if path else str(k))]
    return [] if a == b else [(path, a, b)]


def _moved(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The paths of the facts that differ, a layer's named once for every layer (`layer.shape`, `block_axis`)."""
    names = sorted({*a.get("layers", {}), *b.get("layers", {})}, key=len, reverse=True)

    def fact(path: str) -> str:
        rest = path.removeprefix("layers.")
        return next((rest[len(n) + 1:] for n in names if rest.startswith(f"{n}.")), path)

    return list(dict.fromkeys(fact(p) for p, _, _ in _differing(a, b)))


def _flat_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [f"{path}: {x} -> {y}" for path, x, y in _differing(a, b)]
