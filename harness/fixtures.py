"""Recorded contracts: one JSON file per release under fixtures/contracts/, and the drift check live vs recorded.

A recording keeps the symbolic contracts (what conformance replays without vLLM) and the probe's raw
observations (the shapes, stride orders and write landings that the contracts were read from), for audit.

`python -m harness.fixtures table` prints the contract table across releases (markdown).
`python -m harness.fixtures main-from 0.33.0` records `main` as a labelled copy of that release's probe: the
nightly index cannot be reached where the fixtures are recorded, so main's recording is the newest release's,
and the nightly lane's live probe + drift check is what tells whether main moved on.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from harness.contract import Contract, ContractError

ROOT = Path(str(resources.files("harness") / "recorded" / "contracts"))  # shipped as package data


@dataclass(frozen=True)
class Recording:
    """What one release's probe found: its contracts plus the raw observations they were read from."""

    release: str
    contracts: tuple[Contract, ...]
    observations: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "contracts": [
                {"logical": list(c.logical), "physical": list(c.physical), "origin": str(c.origin)} for c in self.contracts
            ],
            "observations": self.observations,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recording:
        try:
            contracts = tuple(
                Contract(tuple(c["logical"]), tuple(c["physical"]), c.get("origin", "")) for c in data["contracts"]
            )
            return cls(data["release"], contracts, data.get("observations", {}))
        except KeyError as e:
            raise ContractError(f"recording lacks field {e}: {sorted(data)}") from None


def path(release: str, root: Path = ROOT) -> Path:
    return root / f"{release}.json"


def releases(root: Path = ROOT) -> list[str]:
    """Releases with a recorded contract file, in version order (`main` last)."""
    from harness.matrix import version_key

    return sorted((p.stem for p in root.glob("*.json")), key=version_key)


def load(release: str, root: Path = ROOT) -> Recording:
    """The recorded contracts of `release`; ContractError when there is no recording."""
    p = path(release, root)
    if not p.exists():
        raise ContractError(f"no recorded contracts for vllm {release} ({p} missing); run `nox -s probe -- {release}`")
    rec = Recording.from_json(json.loads(p.read_text()))
    if rec.release != release:
        raise ContractError(f"{p} records release {rec.release!r}, not {release!r}")
    return rec


def save(recording: Recording, root: Path = ROOT) -> Path:
    p = path(recording.release, root)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(recording.to_json(), indent=1) + "\n")
    return p


def drift(recorded: Recording, live: Recording) -> list[str]:
    """Readable differences between two recordings' contracts; empty when the release's contract is unchanged.

    Only contracts are compared (a nightly build is checked against the `main` recording under its own version).
    Contracts are matched by origin (the switch setting they were read under), so a change reads as
    "HND single-layer: physical order B.KV.H.N.D -> B.KV.N.H.D" rather than as one removal plus one addition.
    """
    out = []
    old = {_setting(c): c for c in recorded.contracts}
    new = {_setting(c): c for c in live.contracts}
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a is None:
            out.append(f"{key}: new contract {b.describe()}")
        elif b is None:
            out.append(f"{key}: contract gone (was {a.describe()})")
        else:
            out.extend(f"{key}: {line}" for line in _contract_diff(a, b))
    return out


def _setting(c: Contract) -> str:
    # Backend and setting without the release, so that a nightly build compares cleanly with the release it is
    # checked against.
    return " ".join(p for p in (c.origin.backend, c.origin.setting) if p)


def _contract_diff(a: Contract, b: Contract) -> list[str]:
    out = []
    if a.logical != b.logical:
        out.append(
            f"logical axes [{','.join(a.logical)}] ({a.family}) -> [{','.join(b.logical)}] ({b.family})"
        )
        moved = [ax for ax in a.logical if ax in b.logical and a.logical.index(ax) != b.logical.index(ax)]
        if moved:
            out.append(f"axes moved: {', '.join(f'{ax} {a.logical.index(ax)}->{b.logical.index(ax)}' for ax in moved)}")
    if a.physical != b.physical:
        out.append(f"physical (stride) order {'.'.join(a.physical)} -> {'.'.join(b.physical)}")
    if a.split_rule != b.split_rule:
        out.append(f"K/V split {a.split_rule} -> {b.split_rule}")
    return out


def table(root: Path = ROOT) -> str:
    """Markdown table of every recorded release's contracts; the last column marks where the contracts changed."""
    rows = [
        "| release | family | logical shape | physical orders | split rule | observed by | vs previous |",
        "|---|---|---|---|---|---|---|",
    ]
    previous: frozenset[Contract] | None = None
    for release in releases(root):
        rec = load(release, root)
        by_logical: dict[tuple[str, ...], list[Contract]] = {}
        for c in rec.contracts:
            by_logical.setdefault(c.logical, []).append(c)
        how = rec.observations.get("method", "?")
        if rec.observations.get("copied_from"):
            how = f"copy of the {rec.observations['copied_from']} probe ({how})"
        current = frozenset(rec.contracts)
        change = "" if previous is None else "same" if current == previous else "**changed**"
        previous = current
        for logical, cs in by_logical.items():
            orders = "<br>".join(f"{'.'.join(c.physical)} ({_setting(c)})" for c in cs)
            rows.append(
                f"| {release} | {cs[0].family} | ({','.join(logical)}) | {orders} | {cs[0].split_rule} | {how} "
                f"| {change} |"
            )
            change = ""
    return "\n".join(rows)


def main_from(release: str, root: Path = ROOT) -> Recording:
    """Record `main` as a copy of `release`'s probe, saying so in its observations."""
    src = load(release, root)
    note = (f"copy of the vllm {release} probe: the nightly index could not be reached when this was recorded; "
            "the nightly lane probes main live and fails on drift from these contracts")
    rec = Recording("main", src.contracts, dict(src.observations, copied_from=release, note=note))
    save(rec, root)
    return rec


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        print(table())
        return 0
    if argv[:1] == ["main-from"] and len(argv) == 2:
        print(f"recorded main as a copy of {main_from(argv[1]).observations['copied_from']}")
        return 0
    print("usage: python -m harness.fixtures table | main-from RELEASE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
