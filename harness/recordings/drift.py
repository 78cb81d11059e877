"""The drift check: a live probe of a release against its recording, contract by contract, backend by backend, and
the layout API it answers (harness.vllm_api.surface)."""

from __future__ import annotations

from harness.backends import LAYOUT_ENV, LAYOUT_VALUES
from harness.contract import Contract
from harness.recordings import allocations
from harness.recordings.store import Recording
from harness.vllm_api.surface import surface_diff


def drift(recorded: Recording, live: Recording) -> list[str]:
    """Readable differences between two recordings' contracts; empty when the release's contract is unchanged.

    Contracts are compared (a nightly build is checked against the `main` recording under its own version), and
    so is whether each backend could be read: a backend the live probe could not import or read is one line naming
    it and the error, in place of a "contract gone" line per contract the recording has from it; a recording that
    could not read that backend either is no drift. Where the live probe kept it, the layout API is compared too
    (harness.vllm_api.surface: names, signatures, answers; a recording without it drifts until re-recorded), and
    so is the whole-model allocation the live probe read (harness.recordings.allocations.diff).
    Contracts are matched by origin (the switch setting they were read under), so a change reads as
    "HND single-layer: physical order B.KV.H.N.D -> B.KV.N.H.D" rather than as one removal plus one addition.
    """
    out, unread = [], set()
    was = recorded.observations.get("backends", {})
    counts: dict[str, int] = {}
    for c in recorded.contracts:
        counts[c.origin.backend_name] = counts.get(c.origin.backend_name, 0) + 1
    for name, seen in sorted(live.observations.get("backends", {}).items()):
        before = was.get(name, {})
        unreadable = seen.get("read") is False and before.get("read") is not False
        # On a carried subset of a release a module left out looks absent from the release: read None, present False.
        vanished = seen.get("read") is None and before.get("read") is True
        if unreadable or vanished:
            unread.add(name)
            n = counts.get(name, 0)
            had = f"; the recording read {n} contract{'s' * (n != 1)} from it" if n else ""
            out.append(f"backend {name} could not be imported or read: {seen.get('why', 'no reason recorded')}{had}")
    old = {_setting(c): c for c in recorded.contracts}
    new = {_setting(c): c for c in live.contracts}
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a is None:
            out.append(f"{key}: new contract {b.describe()}")
        elif b is None:
            if a.origin.backend_name not in unread:
                out.append(f"{key}: contract gone (was {a.describe()})")
        else:
            out.extend(f"{key}: {line}" for line in _contract_diff(a, b))
    if live.api is not None:  # a live probe keeps the layout API: its surface and answers must not move either
        out.extend(f"layout API: {line}" for line in surface_diff(recorded.api, live.api))
    if "allocations" in live.observations:  # and what it allocates for a whole model (harness.recordings.allocations)
        out.extend(f"allocation: {line}" for line in allocations.diff(
            recorded.observations.get("allocations"), live.observations["allocations"]))
    return out


def _setting(c: Contract) -> str:
    # Backend and setting without the release, so that a nightly build compares cleanly with the release it is
    # checked against; spelled as the probe spells them now (the backend without `_VLLM_V1`, a layout value as
    # VLLM_KV_CACHE_LAYOUT=<value>), so that a recording of an older spelling compares with a live probe.
    dtype = "" if c.cache_dtype == "auto" else c.cache_dtype
    setting = " + ".join(" ".join(f"{LAYOUT_ENV}={w}" if w in LAYOUT_VALUES else w for w in part.split())
                         for part in c.origin.setting.split(" + "))
    return " ".join(p for p in (c.origin.backend_name, dtype, setting) if p)


def _contract_diff(a: Contract, b: Contract) -> list[str]:
    out = []
    x, y = a.layout, b.layout
    if x.logical != y.logical:
        out.append(f"logical axes [{','.join(x.logical)}] ({x.family}) -> [{','.join(y.logical)}] ({y.family})")
        moved = [ax for ax in x.logical if ax in y.logical and x.logical.index(ax) != y.logical.index(ax)]
        if moved:
            out.append(f"axes moved: {', '.join(f'{ax} {x.logical.index(ax)}->{y.logical.index(ax)}' for ax in moved)}")
    if x.physical != y.physical:
        out.append(f"physical (stride) order {'.'.join(x.physical)} -> {'.'.join(y.physical)}")
    if a.split_rule != b.split_rule:
        out.append(f"K/V split {a.split_rule} -> {b.split_rule}")
    return out
