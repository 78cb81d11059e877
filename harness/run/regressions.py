"""Kept failing examples: written under <regressions>/<subject>/ when an item fails, replayed first by every later
session, and the one REPRO line that names each."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from harness.checks import Check
from harness.run import implementation
from harness.run.implementation import Drawn
from harness.run.session import Session
from harness.run.targets import Target


@dataclass(frozen=True)
class Regression:
    """A kept failing example, bound to one release of the session that has its geometry."""

    target: Target
    example: Drawn
    extra: object
    digest: str


def regressions(session: Session, check: Check) -> list[Regression]:
    """Every kept failing example of `check` found on this kind of device (a GPU-sized example is not replayed by
    the CPU interpreter), bound to each session target its implementation replays it on (harness.run.implementation:
    by default the check's targets of the example's geometry)."""
    it = implementation.of(check)
    paths = sorted((session.regressions_dir / session.subject_name).glob(f"{check.name}-*.json"))
    targets = it.targets(session) if paths else []  # once, however many examples are kept
    out = []
    for path in paths:
        body = json.loads(path.read_text())
        if body.get("device", device_kind(session.device)) != device_kind(session.device):
            continue
        ex = it.read(body["example"])
        digest = path.stem.split("-")[-1]
        out += [Regression(t, ex, body.get("extra"), digest)
                for t in it.replayed(session, targets, body["geometry"], ex)]
    return out


def keep(session: Session, target: Target, check: str, ex: Drawn, extra: object) -> None:
    """Keep a failing example for every later session to replay first."""
    d = session.regressions_dir / session.subject_name
    d.mkdir(parents=True, exist_ok=True)
    body = {"check": check, "subject": session.subject_name, "release": target.release.release,
            "geometry": target.geometry, "example": json.loads(ex.to_json()), "extra": extra,
            "case": ex.summary(extra),
            "device": device_kind(session.device)}
    (d / f"{check}-{ex.digest()}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def item_id(target: Target, digest: str) -> str:
    """The pytest id of a kept example's replay item for one release (the regression items' parametrization)."""
    return f"{target.release.release}-{target.geometry}-{digest}"


def selects(target: Target, digest: str) -> str:
    """A `-k` expression that selects the replay item of this release only: the kept example is replayed for every
    release with its geometry, and a digest alone matches each of them."""
    return f"[{target.release.release}- and -{digest}]"


def repro(target: Target, check: str, ex: Drawn, extra: object, command: str, where: str = "") -> str:
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


def device_kind(device: str) -> str:
    """The kind of device a kept example was found on ("cuda", "cpu")."""
    return device.split(":")[0]
