"""What changed since a previous report: both reports' outcome classes per key (harness.report.keys), compared key by
key.

New failures are keys that fail (fail or error) now and did not before (passed, were known, not run, or did not
exist); fixes are keys that failed and pass now. Geometries and backends appeared or vanished per subject and release,
within the releases both reports have (a subject or release only one has is listed as such). Known findings gone
stale (unexercised): stale (unexercised) now, not before.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from harness.matrix import version_key
from harness.report import cells, keys, schema
from harness.report.keys import Key
from harness.report.schema import Change, Changes, Presence, Report
from harness.results import Result

def load(path: Path) -> Report:
    """A previous report.json, checked to be one this kvconform can compare against; a ValueError naming the file."""
    try:
        return schema.read(path)
    except ValueError as e:
        raise ValueError(f"--since {e}") from None


def _decode(report: Report, path: Path) -> dict[Key, str]:
    try:
        return {Key(*k[:6]): k[6] for k in report.keys}
    except (TypeError, IndexError) as e:
        raise ValueError(f"--since {path}: a malformed `keys` entry: {e}") from None


def _grouped(found: list[tuple[Key, str, str]], repros: dict[Key, str]) -> tuple[Change, ...]:
    by: dict[tuple, list[str]] = defaultdict(list)
    for k, before, after in found:
        by[(k.subject, k.release, k.check, k.geometry, k.cache_dtype, before, after)].append(k.backend)
    out = []
    for (subject, release, check, geometry, dtype, before, after), backends in by.items():
        repro = next((r for b in backends if (r := repros.get(Key(subject, release, b, dtype, geometry, check)))), "")
        out.append(Change(subject, release, check, geometry, dtype, tuple(sorted(b for b in backends if b)), before,
                          after, repro))
    return tuple(sorted(out, key=lambda c: (c.subject, c.release, c.check, c.geometry, c.cache_dtype)))


def _marked(lines: tuple[Result, ...]) -> set[tuple[str, str, str]]:
    """The known findings a report lists as stale or unexercised (`lines`), per subject and release."""
    return {(r.subject, r.release, f"{r.known} ({r.check})") for r in lines}


def compare(old: Report, new: Report, since: Path) -> Changes:
    """What changed from report `old` (a loaded report.json, read from `since`) to report `new` (the one being
    folded)."""
    before, now = _decode(old, since), keys.classes(new.rows)
    repros: dict[Key, str] = {}
    for row in new.rows:
        for k in row.keys:
            repros.setdefault(k, next(iter(row.repros), ""))
    new_failures = [(k, before.get(k, "absent"), c) for k, c in now.items()
                    if c in cells.FAILING and before.get(k) not in cells.FAILING]
    fixes = [(k, c, now[k]) for k, c in before.items() if c in cells.FAILING and now.get(k) == cells.PASS_CLASS]
    # The releases with result lines (keys): a release only the performance lane benched is no conformance release.
    old_releases, new_releases = {k.release for k in before}, {k.release for k in now}
    old_subjects, new_subjects = {k.subject for k in before}, {k.subject for k in now}

    def present(classes: dict[Key, str], field: str) -> set[tuple[str, str, str]]:
        # Within the subjects and releases both reports have: the others are listed as such, not geometry by geometry.
        return {(k.subject, k.release, getattr(k, field)) for k in classes
                if k.release in old_releases & new_releases and k.subject in old_subjects & new_subjects
                and getattr(k, field)}

    def diff(a: set, b: set) -> tuple[Presence, ...]:
        return tuple(Presence(*p) for p in sorted(a - b))

    geo_old, geo_new = present(before, "geometry"), present(now, "geometry")
    be_old, be_new = present(before, "backend"), present(now, "backend")
    order = sorted(new_releases | old_releases, key=version_key)
    return Changes(
        since=str(since), since_verdict=old.verdict,
        new_failures=_grouped(new_failures, repros), fixes=_grouped(fixes, repros),
        subjects_appeared=tuple(sorted(new_subjects - old_subjects)),
        subjects_vanished=tuple(sorted(old_subjects - new_subjects)),
        releases_appeared=tuple(r for r in order if r in new_releases - old_releases),
        releases_vanished=tuple(r for r in order if r in old_releases - new_releases),
        geometries_appeared=diff(geo_new, geo_old), geometries_vanished=diff(geo_old, geo_new),
        backends_appeared=diff(be_new, be_old), backends_vanished=diff(be_old, be_new),
        gone_stale=diff(_marked(new.stale_findings), _marked(old.stale_findings)),
        gone_unexercised=diff(_marked(new.unexercised_findings), _marked(old.unexercised_findings)))
