"""Each release × check cell across reports, and the last build that passed.

A report keeps, as `history`, the release × check cells (passed, total, red) of the earlier reports it was given
(`--since`, oldest first) and of the history each of those kept, up to KEPT reports: a nightly chain that passes only
the previous report still accumulates. A point is one report; two reports folded from the same runs are one point.

`last_passed`: per subject and release, the build of the newest lines that passed there (no new finding, something
passed), else what the newest earlier report said: the pin a consumer can copy.
"""

from __future__ import annotations

from harness.matrix import version_key
from harness.report import cells
from harness.report.schema import Counts, Face, Passed, Point, Report
from harness.results import Result

KEPT = 30  # earlier reports a report keeps


def point(data: Report, label: str) -> Point:
    """One report as a history point: when its newest line was written, its runs, verdict and cells."""
    return Point(label, _when(data), tuple(r.run for r in data.runs), data.verdict,
                 {s: {rel: {check: _face(counts) for check, counts in cs.items()} for rel, cs in by.items()}
                  for s, by in data.checks.items()})


def history(earlier: list[tuple[str, Report]]) -> tuple[Point, ...]:
    """The points of earlier reports (label, report.json as loaded), oldest first: each one's own history, then it."""
    points: dict[tuple[str, ...], Point] = {}
    for label, data in earlier:
        for p in [*data.history, point(data, label)]:
            points[p.runs] = p
    return tuple(sorted(points.values(), key=lambda p: p.when)[-KEPT:])


def series(data: Report, subject: str, release: str, check: str) -> list[tuple[str, Face | None]]:
    """A cell over the history and now: (when, (passed, total, red) or None where that report had no such cell)."""
    now = data.checks.get(subject, {}).get(release, {}).get(check)
    return [*((p.when, p.cells.get(subject, {}).get(release, {}).get(check)) for p in data.history),
            (_when(data), _face(now) if now else None)]


def last_change(data: Report, subject: str, release: str, check: str) -> str:
    """`was 12/15 on 2026-12-01` for the newest earlier point whose cell differs from now ("" when none does)."""
    *before, (_, now) = series(data, subject, release, check)
    for when, cell in reversed(before):
        if cell != now:
            was = "absent" if cell is None else f"{cell[0]:,}/{cell[1]:,}" + (" red" if cell[2] else "")
            return f"was {was} on {when[:10] or 'a date not recorded'}"
    return ""


def last_passed(data: Report, rows: list[Result], before: Report | None) -> dict[str, dict[str, Passed]]:
    """Per subject and release, the build that last passed there. `rows`: this report's result lines; `before`: the
    newest earlier report (its `last_passed` carries over where nothing passes now)."""
    out: dict[str, dict[str, Passed]] = {s: dict(by) for s, by in (before.last_passed if before else {}).items()}
    newest: dict[tuple[str, str], Result] = {}  # (subject, release) -> its newest line that names a build
    for r in rows:
        key = (r.subject, r.release)
        if r.build and (key not in newest or r.time > newest[key].time):
            newest[key] = r
    for subject, by in data.checks.items():
        for release, cs in by.items():
            merged: dict[str, int] = {}
            for counts in cs.values():
                for w, n in counts.items():
                    merged[w] = merged.get(w, 0) + n
            c = cells.cell(merged)
            line = newest.get((subject, release))
            if c is None or c.red or not c.passed or line is None:
                continue
            out.setdefault(subject, {})[release] = Passed(line.build, line.build.pin, line.run, line.time)
    return {s: dict(sorted(by.items(), key=lambda kv: version_key(kv[0]))) for s, by in sorted(out.items())}


def _when(data: Report) -> str:
    """When a report's newest line was written ("" when none says)."""
    return max((r.last for r in data.runs), default="")


def _face(counts: Counts) -> Face:
    c = cells.cell(counts)
    return (c.passed, c.total, c.red)
