"""Kept failing examples: written under <regressions>/<subject>/ when an item fails, replayed first by every later
session, and the one REPRO line that names each."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from harness import checks
from harness.model import Moves
from harness.run.session import Session
from harness.run.targets import Target, targets
from harness.strategies import Example


@dataclass(frozen=True)
class Regression:
    """A kept failing example, bound to one release of the session that has its geometry."""

    target: Target
    example: Example | Moves
    extra: object
    digest: str


def regressions(session: Session, check: str) -> list[Regression]:
    """Every kept failing example of `check` found on this kind of device (a GPU-sized example is not replayed by
    the CPU interpreter), bound to each session target of the check with its geometry (that release's own contract
    of it: its layer is that release's setting and backend), or, for a check that uses no cache, to each session
    release with the example's geometry."""
    out = []
    by_geometry: dict[str, list[Target]] = {}
    for t in targets(session, checks.get(check)):
        by_geometry.setdefault(t.geometry, []).append(t)
    for path in sorted((session.regressions_dir / session.subject_name).glob(f"{check}-*.json")):
        body = json.loads(path.read_text())
        if body.get("device", device_kind(session.device)) != device_kind(session.device):
            continue
        ex = example(body["example"])
        digest = path.stem.split("-")[-1]
        if body["geometry"] in by_geometry or isinstance(ex, Moves) or body["geometry"] == ex.contract.name:
            out += [Regression(t, ex, body.get("extra"), digest) for t in by_geometry.get(body["geometry"], [])]
            continue
        own = {r.release: next((c for c in r.contracts if c.name == ex.contract.name), None) for r in session.releases}
        out += [Regression(Target(r, own[r.release], body["geometry"]), ex, body.get("extra"), digest)
                for r in session.releases if own[r.release] is not None]
    return out


def keep(session: Session, target: Target, check: str, ex: Example | Moves, extra: object) -> None:
    """Keep a failing example for every later session to replay first."""
    d = session.regressions_dir / session.subject_name
    d.mkdir(parents=True, exist_ok=True)
    body = {"check": check, "subject": session.subject_name, "release": target.release.release,
            "geometry": target.geometry, "example": json.loads(ex.to_json()), "extra": extra,
            "case": repr(ex.case) if isinstance(ex, Example) else ex.words(extra),
            "device": device_kind(session.device)}
    (d / f"{check}-{ex.digest()}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def item_id(target: Target, digest: str) -> str:
    """The pytest id of a kept example's replay item for one release (the regression items' parametrization)."""
    return f"{target.release.release}-{target.geometry}-{digest}"


def selects(target: Target, digest: str) -> str:
    """A `-k` expression that selects the replay item of this release only: the kept example is replayed for every
    release with its geometry, and a digest alone matches each of them."""
    return f"[{target.release.release}- and -{digest}]"


def repro(target: Target, check: str, ex: Example | Moves, extra: object, command: str, where: str = "") -> str:
    """ONE line that reproduces a failing example: what it is, where in it the failure was found (`where`, when the
    check says), and `command`, which replays it (the one replay item of this release, by its digest)."""
    return (f"REPRO {check} release={target.release.release} ({target.release.source}) "
            f"geometry={target.geometry} {ex.words(extra)}" + (f" at {where}" if where else "") + " :: "
            f"{command} -k '{selects(target, ex.digest())}'")


def missing(session: Session, keyword: str) -> str | None:
    """Why a REPRO line's `-k` selection (`selects`) can replay nothing here, None when it can or `keyword` is not
    one: its kept example is not in the session's regressions folder, or was found on another kind of device."""
    named = re.fullmatch(r"\[(\S+)- and -([0-9a-f]+)\]", keyword.strip())
    if named is None:
        return None
    release, digest = named.groups()
    d = session.regressions_dir / session.subject_name
    kept = sorted(d.glob(f"*-{digest}.json"))
    if not kept:
        return (f"-k '{keyword}' replays kept example {digest} of {session.subject_name} (release {release}), which "
                f"is not in {d}: a REPRO line replays the example its run kept under its regressions folder. For a run "
                f"elsewhere (a CI annotation), take that run's results (the workflow's kvconform-results-{release} "
                "artifact) and name the regressions/ folder they hold with --kvconform-regressions-dir")
    found = json.loads(kept[0].read_text()).get("device", device_kind(session.device))
    if found != device_kind(session.device):
        return (f"-k '{keyword}': kept example {kept[0]} was found on {found} and is replayed there only (this run is "
                f"on {session.device})")
    return None


def example(body: dict) -> Example | Moves:
    """A kept example read back: a connector check's block moves, or a placed case."""
    return Moves.from_json(json.dumps(body)) if "model" in body else Example.from_json(json.dumps(body))


def device_kind(device: str) -> str:
    """The kind of device a kept example was found on ("cuda", "cpu")."""
    return device.split(":")[0]
