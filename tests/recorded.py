"""Real recordings cut down for tests: a release's layout API (whose stand-ins hand subjects their layers) with the
contracts of some of its geometries, under the recording's own release name or another."""

from __future__ import annotations

from harness.contract import Contract
from harness.recordings import store


def geometries(release: str, names: list[str] | None = None, count: int | None = None) -> tuple[Contract, ...]:
    """`release`'s recorded contracts of the geometries `names` (in that order; all when None), or its first `count`
    distinct ones; KeyError naming what the recording lacks."""
    rec = store.load(release)
    by_name = {}
    for c in rec.contracts:
        by_name.setdefault(c.name, c)
    if names is None:
        return tuple(by_name.values())[:count]
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"the recording of {release} has no geometry {', '.join(missing)}; it has {sorted(by_name)}")
    return tuple(by_name[n] for n in names)


def cut(release: str, contracts: tuple[Contract, ...], name: str | None = None) -> store.Recording:
    """A recording named `name` (default `release`) of `contracts`, with `release`'s observations and layout API but
    its whole-model allocations (their layers' contracts are the release's, which the cut may leave out)."""
    rec = store.load(release)
    observed = {k: v for k, v in rec.observations.items() if k != "allocations"}
    return store.Recording(name or release, contracts, observed, rec.api)
