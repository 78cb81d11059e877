"""Recorded contracts: one JSON file per release under fixtures/contracts/ (harness.recordings.drift compares a live
probe with one).

A recording keeps the symbolic contracts (what conformance replays without vLLM) and the probe's raw
observations (the shapes, stride orders and write landings that the contracts were read from), for audit.

`python -m harness.recordings.store table` prints the contract table across releases, backends and cache dtypes
(markdown); `python -m harness.recordings.store matrix` the same folded to release ranges x (backend, cache dtype);
`python -m harness.recordings.store api-changes` what a consumer can call, release by release
(harness.recordings.api_history); `python -m harness.recordings.store allocations` what each release allocates for a
whole model, and what changed between releases (harness.recordings.allocations).
Recordings made before backends and cache dtypes were probed read as FLASH_ATTN model-dtype contracts (a contract
without `cache_dtype` / `diff_kv` fields is `auto` / equal head dims), so they replay unchanged.
`python -m harness.recordings.store main-from 0.33.0` records `main` as a labelled copy of that release's probe: the
nightly index cannot be reached where the fixtures are recorded, so main's recording is the newest release's,
and the nightly lane's live probe + drift check is what tells whether main moved on.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import ALIASES, CACHE_DTYPES, Contract, ContractError
from harness.recordings import allocations, api_history

# Where the recordings lie: the report reads them without torch.
from harness.recordings.api_history import ROOT, releases


@dataclass(frozen=True)
class Recording:
    """What one release's probe found: its contracts plus the raw observations they were read from."""

    release: str
    contracts: tuple[Contract, ...]
    observations: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    api: dict[str, Any] | None = field(default=None, compare=False, hash=False)  # harness.vllm_api.surface

    def to_json(self) -> dict[str, Any]:
        out = {
            "release": self.release,
            "contracts": [c.to_json() for c in self.contracts],
            "observations": self.observations,
        }
        return out if self.api is None else {**out, "api": self.api}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recording:
        if not isinstance(data, dict) or not data:
            raise ContractError(f"{'an empty JSON object' if data == {} else f'a JSON {type(data).__name__}'}, not "
                                "an object with the fields release, contracts, observations and api")
        try:
            contracts = tuple(Contract.from_json(c) for c in data["contracts"])
            return cls(data["release"], contracts, data.get("observations", {}), data.get("api"))
        except KeyError as e:
            raise ContractError(f"no field {e} (it has {', '.join(sorted(data))})") from None


def path(release: str, root: Path = ROOT) -> Path:
    return root / f"{release}.json"


class BadRecording(ValueError):
    """A recording file that cannot be read as one (a usage error: nothing of its release can be checked)."""


def load(release: str, root: Path = ROOT) -> Recording:
    """The recorded contracts of `release`; ContractError when there is no recording, BadRecording (naming the file,
    and the line where the parser knows it) when the file is not a recording."""
    p = path(release, root)
    if not p.exists():
        raise ContractError(f"no recorded contracts for vllm {release} ({p} missing); run `nox -s probe -- {release}`")
    try:
        rec = Recording.from_json(json.loads(p.read_text()))
    except json.JSONDecodeError as e:
        raise BadRecording(f"{p}:{e.lineno}:{e.colno}: not a recording: invalid JSON ({e.msg}); re-record it with "
                           f"`nox -s probe -- {release}`") from None
    except (ContractError, AttributeError, TypeError, ValueError) as e:
        raise BadRecording(f"{p}: not a recording: {e}") from None
    if rec.release != release:
        raise BadRecording(f"{p} records release {rec.release!r}, not {release!r}")
    return rec


def save(recording: Recording, root: Path = ROOT) -> Path:
    p = path(recording.release, root)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(recording.to_json(), indent=1) + "\n")
    return p


def unmodelled(rec: Recording) -> dict[str, list[str]]:
    """The cache dtypes the recording's backends list in `supported_kv_cache_dtypes` that kvconform does not model
    (harness.contract.CACHE_DTYPES), each with the backends that list it: no contract of them is recorded.
    `float16` and `bfloat16` are not among them: they name the element type of `auto`'s layout."""
    out: dict[str, list[str]] = {}
    for backend, seen in rec.observations.get("backends", {}).items():
        for name in seen.get("supported_kv_cache_dtypes") or ():
            if ALIASES.get(name, name) not in CACHE_DTYPES and name not in ("float16", "bfloat16"):
                out.setdefault(name, []).append(backend)
    return out


def _keyed(rec: Recording) -> dict[tuple[str, str], list[Contract]]:
    """A recording's contracts by (backend, cache dtype), in probe order."""
    out: dict[tuple[str, str], list[Contract]] = {}
    for c in rec.contracts:
        out.setdefault((c.origin.backend_name, c.cache_dtype), []).append(c)
    return out


def _observed(rec: Recording, backend: str, cache_dtype: str) -> str:
    """How the backend's own write path was seen to agree with these contracts (or why not)."""
    b = rec.observations.get("backends", {}).get(backend, {})  # keyed by kvconform's names, suffix-free
    writes = [o.get("write") for k, o in b.get("settings", {}).items() if k.split(" ")[0] == cache_dtype]
    landed = sorted({w["path"] for w in writes if isinstance(w, dict) and "views" not in w})
    handed = sorted({w["path"] for w in writes if isinstance(w, dict) and "views" in w})
    why = sorted({w.split(": ", 1)[-1] for w in writes if isinstance(w, str)})
    text = "; ".join([*([f"K and V landed as split ({', '.join(landed)})"] if landed else []),
                      *([f"write views checked ({', '.join(handed)})"] if handed else [])]) or \
        f"write not observed: {'; '.join(why)}"
    stubbed = " [GPU library stubbed]" if b.get("gpu_library_stubbed") else ""
    return text + stubbed


def table(root: Path = ROOT) -> str:
    """Markdown table of every recorded release's contracts per attention backend and cache dtype; the last column
    marks where a backend's contracts changed from the previous release."""
    rows = [
        "| release | backend | cache dtype | family | logical shape | physical orders | split rule | observed | vs previous |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    previous: dict[tuple[str, str], frozenset[Contract]] = {}
    for release in releases(root):
        rec = load(release, root)
        for (backend, dtype), cs in _keyed(rec).items():
            current = frozenset(cs)
            before = previous.get((backend, dtype))
            change = "new" if before is None else "same" if current == before else "**changed**"
            previous[(backend, dtype)] = current
            for family in dict.fromkeys(c.layout.family for c in cs):
                fc = [c for c in cs if c.layout.family == family]
                orders = " ".join(".".join(c.layout.physical) for c in fc)
                rows.append(f"| {release} | {backend} | {dtype} | {family}{' (diff-KV)' if fc[0].diff_kv else ''} "
                            f"| ({','.join(fc[0].layout.logical)}) | {orders} | {fc[0].split_rule} | "
                            f"{_observed(rec, backend, dtype)} | {change} |")
                change = ""
    return "\n".join(rows)


def matrix(root: Path = ROOT) -> str:
    """Markdown: release ranges x (backend, cache dtype), each cell the family and how many geometries; consecutive
    releases with the same cells share a row, so every row boundary is a contract change."""
    cells: list[tuple[str, dict[tuple[str, str], str]]] = []
    for release in releases(root):
        rec = load(release, root)
        row = {}
        for key, cs in _keyed(rec).items():
            fams = dict.fromkeys(c.layout.family + ("+diff-KV" if c.diff_kv else "") for c in cs)
            row[key] = " ".join(f"{f} ×{sum(1 for c in cs if c.layout.family == f.split('+')[0])}" for f in fams)
        cells.append((release, row))
    seen = list(dict.fromkeys(k for _, row in cells for k in row))
    backends = list(dict.fromkeys(b for b, _ in seen))
    dtypes = list(CACHE_DTYPES)
    columns = sorted(seen, key=lambda k: (backends.index(k[0]), dtypes.index(k[1])))
    head = "| releases | " + " | ".join(f"{b}<br>{d}" for b, d in columns) + " |"
    out = [head, "|---" * (len(columns) + 1) + "|"]
    spans: list[list] = []
    for release, row in cells:
        if spans and spans[-1][2] == row:
            spans[-1][1] = release
        else:
            spans.append([release, release, row])
    for first, last, row in spans:
        name = first if first == last else f"{first} – {last}"
        out.append(f"| {name} | " + " | ".join(row.get(k, "—") for k in columns) + " |")
    return "\n".join(out)


def main_from(release: str, root: Path = ROOT) -> Recording:
    """Record `main` as a copy of `release`'s probe, saying so in its observations."""
    src = load(release, root)
    note = (f"copy of the vllm {release} probe: the nightly index could not be reached when this was recorded; "
            "the nightly lane probes main live and fails on drift from these contracts")
    rec = Recording("main", src.contracts, dict(src.observations, copied_from=release, note=note), src.api)
    save(rec, root)
    return rec


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        print(table())
        return 0
    if argv[:1] == ["matrix"]:
        print(matrix())
        return 0
    if argv[:1] == ["api-changes"]:
        print(api_history.table())
        return 0
    if argv[:1] == ["allocations"]:
        print(allocations.table(), "", allocations.changes(), sep="\n")
        return 0
    if argv[:1] == ["main-from"] and len(argv) == 2:
        print(f"recorded main as a copy of {main_from(argv[1]).observations['copied_from']}")
        return 0
    print("usage: python -m harness.recordings.store table | matrix | api-changes | allocations | main-from RELEASE",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
