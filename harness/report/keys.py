"""The keys a report is compared and searched on: one check of one geometry of one release, as one backend reads it
(subject, release, backend, cache dtype, geometry, check), each with its outcome class; and what makes two failing
result lines one finding.

A key's class is its worst line's (harness.report.cells): one failing example among passes fails the key. A line that
names several backends (they hand a layer the same geometry) stands for each of them.

A finding is one bug where it shows: the lines of one subject, release, check and geometry (a model's is
`model:<name>`; the geometry names its cache dtype, and in one release the backends that hand it) that end in the same
outcome with the same diagnosis up to its numbers (`kind`). Everything else a line holds is how it was found, not what:
the run (the same subject run twice), the example and its case digest (a kept example's replay item and its
generated item, or another failing example of the same bug), the sparsity mode, the REPRO line and the time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import astuple, dataclass

from harness.report import cells
from harness.results import Result


@dataclass(frozen=True, order=True)
class Key:
    """What a run is compared on: one check of one geometry of one release, as one backend reads it."""

    subject: str
    release: str
    backend: str  # "" for lines that name no backend (whole-release outcomes, the dense oracle)
    cache_dtype: str
    geometry: str
    check: str


@dataclass(frozen=True)
class DrillRow:
    """A drill-down row: one subject, release, check, geometry, backends and cache dtype, its word counts and up to
    ROW_REPROS REPRO lines of its findings."""

    subject: str
    release: str
    check: str
    geometry: str
    backends: tuple[str, ...]
    cache_dtype: str
    counts: dict[str, int]  # outcome word -> result lines, the worst word first
    repros: tuple[str, ...]

    @property
    def keys(self) -> tuple[Key, ...]:
        """The keys it stands for: one per backend it names (a line naming none: backend "")."""
        return tuple(Key(self.subject, self.release, b, self.cache_dtype, self.geometry, self.check)
                     for b in self.backends or ("",))


def classes(rows: tuple[DrillRow, ...]) -> dict[Key, str]:
    """Each key's outcome class, from a report's drill-down rows."""
    out: dict[Key, list[str]] = defaultdict(list)
    for row in rows:
        cls = cells.class_of(row.counts)
        if all(cells.outcome_class(w) in cells.FINDING_CLASSES for w in row.counts):
            continue  # a stale or unexercised finding's line: no check's outcome
        for k in row.keys:
            out[k].append(cls)
    return {k: cells.worst(v) for k, v in out.items()}


def encoded(classes: dict[Key, str]) -> tuple[tuple[str, ...], ...]:
    """The keys as report.json holds them: [subject, release, backend, cache dtype, geometry, check, class]."""
    return tuple((*astuple(k), c) for k, c in sorted(classes.items()))


def kind(diagnosis: str) -> str:
    """A diagnosis up to its numbers (`1 of 8 differ` and `5 of 8 differ` are one kind of failure)."""
    return re.sub(r"\d+", "#", diagnosis)


def finding(line: Result) -> tuple[str, ...]:
    """What identifies a failing result line's finding: subject, release, check, geometry, outcome and the kind of its
    diagnosis. Two lines with the same are one finding, however many runs, items and examples they come from."""
    return (line.subject, line.release, line.check, line.geometry, line.outcome.value, kind(line.diagnosis))
