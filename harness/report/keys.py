"""The keys a report is compared and searched on: one check of one geometry of one release, as one backend reads it
(subject, release, backend, cache dtype, geometry, check), each with its outcome class.

A key's class is its worst line's (harness.report.cells): one failing example among passes fails the key. A line that
names several backends (they hand a layer the same geometry) stands for each of them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import astuple, dataclass

from harness.report import cells


@dataclass(frozen=True, order=True)
class Key:
    """What a run is compared on: one check of one geometry of one release, as one backend reads it."""

    subject: str
    release: str
    backend: str  # "" for lines that name no backend (whole-release outcomes, the dense oracle)
    cache_dtype: str
    geometry: str
    check: str


def classes(rows: list[dict]) -> dict[Key, str]:
    """Each key's outcome class, from a report's rows (the report data's `rows`)."""
    out: dict[Key, list[str]] = defaultdict(list)
    for row in rows:
        cls = cells.class_of(row["counts"])
        if all(cells.outcome_class(w) in cells.FINDING_CLASSES for w in row["counts"]):
            continue  # a stale or unexercised finding's line: no check's outcome
        for backend in row["backends"] or [""]:
            out[Key(row["subject"], row["release"], backend, row["cache_dtype"], row["geometry"],
                    row["check"])].append(cls)
    return {k: cells.worst(v) for k, v in out.items()}


def encoded(classes: dict[Key, str]) -> list[list[str]]:
    """The keys as report.json holds them: [subject, release, backend, cache dtype, geometry, check, class]."""
    return [[*astuple(k), c] for k, c in sorted(classes.items())]
