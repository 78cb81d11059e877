"""Failures only one release (or one backend, or one cache dtype) has: the query a reader runs first on a matrix of
implementations.

Over a report's keys (harness.report.keys, each with its outcome class): a release-specific failure is a (subject,
check, geometry, backend, cache dtype) that ran on two or more releases and fails (fail, error or a known finding)
on exactly one of them. Backend-specific: a (subject, check, release, geometry) that two or more backends ran and
exactly one of them fails. Within one geometry (a model's, `model:<name>`, included; a geometry names its cache dtype)
only: a backend whose failing geometries no other backend ran is confounded with them (where the kernel-split models
are the only ones recorded with FlashInfer, a bug of theirs says nothing of FlashInfer), and is not named.
Cache-dtype-specific: a (subject, check, release, backend, geometry up to its cache dtype) that fails on exactly one of
the cache dtypes it ran with. A key that was not run (unsupported, skipped, ...) neither counts as having it nor as
failing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from harness.report import cells
from harness.report.keys import Key

RELEASE, BACKEND, CACHE_DTYPE = DIMENSIONS = ("release", "backend", "cache dtype")
_FAILS = (*cells.FAILING, cells.KNOWN_CLASS)


@dataclass(frozen=True)
class LoneFailure:
    """One failure only one member of a dimension has: where it fails, what else had it, and what is held fixed."""

    dimension: str  # release, backend or cache dtype
    where: str  # the one release (backend, cache dtype) it fails on
    outcome_class: str  # there: error, fail or known
    among: tuple[str, ...]  # every member that ran it, `where` included
    subject: str
    check: str
    fixed: tuple[tuple[str, str], ...]  # the other fields held fixed, as (field, value)


def _base(geometry: str) -> str:
    """A geometry up to its cache dtype (`packed:B.N.H.C@fp8_e4m3` -> `packed:B.N.H.C`)."""
    return geometry.split("@", 1)[0]


# dimension -> (the member a key is of, the fields held fixed)
_AXES: dict[str, tuple[Callable[[Key], str], Callable[[Key], tuple[tuple[str, str], ...]]]] = {
    RELEASE: (lambda k: k.release,
              lambda k: (("geometry", k.geometry), ("backend", k.backend), ("cache dtype", k.cache_dtype))),
    BACKEND: (lambda k: k.backend, lambda k: (("release", k.release), ("geometry", k.geometry))),
    CACHE_DTYPE: (lambda k: k.cache_dtype,
                  lambda k: (("release", k.release), ("geometry", _base(k.geometry)), ("backend", k.backend))),
}


def lone_failures(classes: dict[Key, str], order: dict[str, list[str]]) -> list[LoneFailure]:
    """Every failure only one member of a dimension has, by dimension, then subject, check and where; `order` gives
    each dimension's members in reading order (releases by version)."""
    out = []
    for dimension, (member, fixed) in _AXES.items():
        by: dict[tuple, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for k, c in classes.items():
            if member(k) and c != cells.NOT_RUN_CLASS:
                by[(k.subject, k.check, fixed(k))][member(k)].append(c)
        for (subject, check, held), members in by.items():
            worst = {m: cells.worst(cs) for m, cs in members.items()}
            failing = [m for m, c in worst.items() if c in _FAILS]
            if len(worst) >= 2 and len(failing) == 1:
                rank = order.get(dimension, [])
                among = tuple(sorted(worst, key=lambda m: (_index(rank, m), m)))
                out.append(LoneFailure(dimension, failing[0], worst[failing[0]], among, subject, check, held))
    return sorted(_backends_merged(out), key=lambda s: (
        DIMENSIONS.index(s.dimension), s.subject, _index(order.get("check", []), s.check), s.check,
        _index(order.get(s.dimension, []), s.where), s.where, s.fixed))


def _index(members: list[str], m: str) -> int:
    return members.index(m) if m in members else len(members)


def _backends_merged(found: list[LoneFailure]) -> list[LoneFailure]:
    """One entry for the backends that share a geometry and so fail alike (their backends joined)."""
    by: dict[LoneFailure, list[str]] = defaultdict(list)
    for s in found:
        held = dict(s.fixed)
        blank = tuple((f, "" if f == "backend" else v) for f, v in s.fixed)  # the entry, up to its backend
        by[LoneFailure(s.dimension, s.where, s.outcome_class, s.among, s.subject, s.check, blank)].append(
            held.get("backend", ""))
    return [LoneFailure(b.dimension, b.where, b.outcome_class, b.among, b.subject, b.check,
                     tuple((f, ", ".join(sorted(bs)) if f == "backend" else v) for f, v in b.fixed))
            for b, bs in by.items()]
