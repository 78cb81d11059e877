"""What the report's sections say, the same in report.md and report.html: the new findings by kind, what changed
since the previous report, the failures only one release, backend or cache dtype has, the runs folded, the known,
stale and unsupported findings, the backends, and the words a matrix's columns, rows and cells are read by.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from harness.report import cells, lone_failures
from harness.report.cells import says
from harness.report.fold import check_key, span
from harness.words import count

LEGEND = ("A cell reads passed/total result lines (every line in the cell, whatever its word), coloured by that "
          "fraction and red with any new failure or error; the other words are counted beside it under their marks "
          "(every word and count: Details); a cell where nothing passed reads as its worst mark; · nothing recorded.")
FIRST_GROUPS = 6  # kinds of new finding on the first screen; the rest under Details
REPROS_SHOWN = 2  # REPRO lines per kind; all of them are in report.json's new_findings
SHOWN = 20  # entries per list of changes or lone failures on the page; all of them are in report.json
API_TITLE = "Layout API changes: what a consumer can call"
API_NOTE = ("Against the recorded release before each release here: names of vLLM's layout modules and backend members "
            "that appeared, disappeared or changed signature or value (every release's: docs/releases.md).")
RUNS_HEAD = ("run", "subject", "contracts from", "releases", "lines", "checks", "written")
RUNS_NOTE = ("partial: the lines of its releases come from more than one run (a narrower run re-checked some items, "
             "an earlier run's other lines stay); `python -m harness.report --run ID` folds only the runs named.")


@dataclass(frozen=True)
class Group:
    """One kind of new finding: same subject, outcome, and diagnosis up to its numbers (one cause, often many
    checks: a subject that cannot be imported fails every check that calls it)."""

    subject: str
    outcome: str
    diagnosis: str  # the first finding's
    checks: tuple[str, ...]
    releases: tuple[str, ...]
    geometries: tuple[str, ...]
    repros: tuple[str, ...]  # distinct; each check's first ahead of the rest, so the shown ones span the checks
    count: int

    @property
    def word(self) -> str:
        """The outcome as its checks say it ("drift" for the drift check's differs)."""
        return " / ".join(dict.fromkeys(says(c, self.outcome) for c in self.checks))


def groups(data: dict) -> list[Group]:
    """The new findings by kind, worst first, then the most frequent."""
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in data["new_findings"]:
        by[(r["subject"], r["outcome"], re.sub(r"\d+", "#", r["diagnosis"]))].append(r)
    out = []
    for (subject, outcome, _), rs in by.items():
        checks = sorted({r["check"] for r in rs}, key=check_key)
        firsts = {r["check"]: r["repro"] for r in reversed(rs) if r["repro"]}
        repros = dict.fromkeys([firsts[c] for c in checks if c in firsts] + [r["repro"] for r in rs if r["repro"]])
        out.append(Group(subject, outcome, rs[0]["diagnosis"], tuple(checks),
                         tuple(r for r in data["releases"] if r in {x["release"] for x in rs}),
                         tuple(g for g in data["geometries"] if g in {x["geometry"] for x in rs}), tuple(repros),
                         len(rs)))
    return sorted(out, key=lambda g: (cells.rank(g.outcome), -g.count, g.subject, g.checks))


def headline(data: dict, g: Group) -> str:
    """A kind of new finding in one line: subject · checks · releases · geometries · how many results."""
    return (f"{g.subject} · {', '.join(g.checks)} · {span(g.releases, data['releases'])} · "
            f"{where(data, g.geometries)} · {count(g.count, 'result')}")


def totals(data: dict, subject: str) -> dict[str, int]:
    """Every word of a subject with its count."""
    total: Counter = Counter()
    for cs in data["checks"][subject].values():
        for counts in cs.values():
            total.update(counts)
    return dict(total)


def known(data: dict) -> list[tuple[str, str, str, str, int]]:
    """Known findings as (id, check, outcome, releases, count), one line per known finding, check and outcome."""
    by: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for k in data["known_findings"]:
        by[(k["id"], k["check"], k["outcome"])].append(k)
    return [(i, c, says(c, o), span({k["release"] for k in ks}, data["releases"]), sum(k["count"] for k in ks))
            for (i, c, o), ks in sorted(by.items())]


def stale(data: dict) -> list[tuple[str, str, str]]:
    """Stale findings as (id, check, releases), one line per known finding and check."""
    by: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in data["stale_findings"]:
        by[(r["known"], r["check"])].append(r["release"])
    return [(k, c, span(rs, data["releases"])) for (k, c), rs in sorted(by.items())]


@dataclass(frozen=True)
class Item:
    """One entry of a list on the page (a change, a failure only one release has): its text and its REPRO line."""

    text: str
    repro: str = ""


@dataclass(frozen=True)
class Section:
    """A titled list of items, the same in markdown and HTML; `more` counts the items left off the page."""

    title: str
    items: tuple[Item, ...]
    more: int = 0
    red: bool = False


def _shown(title: str, items: list[Item], red: bool = False) -> Section:
    return Section(title, tuple(items[:SHOWN]), max(0, len(items) - SHOWN), red)


def _where_of(c: dict) -> str:
    backends = f" · {', '.join(c['backends'])}" if c["backends"] else ""
    return f"{c['subject']} · {c['release']} · {c['check']} · {label(c['geometry'])}{backends}"


def change_sections(data: dict) -> list[Section]:
    """What changed since the previous report, one section per kind of change that has any (none: no changes)."""
    ch = data.get("changes")
    if not ch:
        return []

    def presences(ps: list[dict]) -> list[Item]:
        by: dict[tuple[str, str], list[str]] = defaultdict(list)
        for p in ps:
            by[(p["subject"], p["name"])].append(p["release"])
        return [Item(f"{s} · {label(n)} · {span(rs, data['releases'])}") for (s, n), rs in sorted(by.items())]

    out = [_shown(count(len(ch["new_failures"]), "new failure"),
                  [Item(f"{_where_of(c)}: {c['before']} → {c['after']}", c["repro"]) for c in ch["new_failures"]],
                  red=True),
           _shown(count(len(ch["fixes"]), "fix"),
                  [Item(f"{_where_of(c)}: {c['before']} → {c['after']}") for c in ch["fixes"]]),
           _shown("Subjects appeared", [Item(x) for x in ch["subjects_appeared"]]),
           _shown("Subjects vanished", [Item(x) for x in ch["subjects_vanished"]]),
           _shown("Releases appeared", [Item(r) for r in ch["releases_appeared"]]),
           _shown("Releases vanished", [Item(r) for r in ch["releases_vanished"]]),
           _shown("Geometries appeared", presences(ch["geometries_appeared"])),
           _shown("Geometries vanished", presences(ch["geometries_vanished"])),
           _shown("Backends appeared", presences(ch["backends_appeared"])),
           _shown("Backends vanished", presences(ch["backends_vanished"])),
           _shown("Known findings gone stale", presences(ch["gone_stale"]))]
    return [s for s in out if s.items]


def lone_failure_sections(data: dict) -> list[Section]:
    """The failures only one release, backend or cache dtype has, one section per dimension that has any."""
    out = []
    for dimension in lone_failures.DIMENSIONS:
        found = [s for s in data["specific"] if s["dimension"] == dimension]
        items = [Item(f"{s['subject']} · {s['check']} · "
                      + " · ".join(f"{label(v) if f == 'geometry' else v}" for f, v in s["fixed"] if v)
                      + f": {s['outcome_class']} on {s['where']} only, of " + _among(data, dimension, s["among"]))
                 for s in found]
        if items:
            out.append(_shown(f"Only one {dimension} fails", items, red=any(
                s["outcome_class"] in cells.FAILING for s in found)))
    return out


def _among(data: dict, dimension: str, among: list[str]) -> str:
    if dimension != lone_failures.RELEASE:
        return f"{count(len(among), dimension)} ({', '.join(among)})"
    releases = span(among, data["releases"])
    return releases if releases.startswith("all ") else f"{count(len(among), dimension)} ({releases})"


def backend_lines(data: dict) -> list[str]:
    """Per backend the releases and geometries whose lines name it (the run's: live probes name what they found)."""
    return [f"{b}: {span(by['releases'], data['releases'])} · {where(data, tuple(by['geometries']))}"
            for b, by in data["backends"].items()]


def runs_table(data: dict) -> list[list[str]]:
    """The Runs section's rows: run, subject, contracts from, releases, lines, checks, written (first – last)."""
    out = []
    for r in data["runs"]:
        lines = f"{r['lines']:,} of {r['of']:,} (partial)" if r["partial"] else f"{r['lines']:,}"
        written = r["first"] if r["first"] == r["last"] else f"{r['first']} – {r['last']}"
        out.append([r["run"], ", ".join(r["subjects"]), "/".join(r["sources"]), span(r["releases"], data["releases"]),
                    lines, ", ".join(r["checks"]), written or "unknown"])
    return out


def source(data: dict, subject: str, release: str) -> str:
    """How the release's contracts were read for a subject's lines, and which run they come from (and when it ran);
    lines of several runs say so, with each run's count."""
    o = data["origins"][subject].get(release)
    if o is None:
        return "·"
    if len(o["runs"]) == 1:
        return f"{'/'.join(o['sources'])}, run {o['runs'][0]['run']} at {o['runs'][0]['time']}"
    return f"{'/'.join(o['sources'])}, lines from {len(o['runs'])} runs: " + ", ".join(
        f"run {r['run']} at {r['time']} ({count(r['lines'], 'line')})" for r in o["runs"])


def columns(data: dict, subject: str) -> list[str]:
    """A subject's checks, the columns of its release x check matrix, in the declared order."""
    return sorted({c for cs in data["checks"][subject].values() for c in cs}, key=check_key)


def dtype_columns(data: dict, subject: str) -> list[str]:
    """A subject's cache dtypes, `auto` first; none when it ran with one only (no release x cache dtype matrix)."""
    seen = {d for ds in data["cache_dtypes"].get(subject, {}).values() for d in ds}
    return sorted(seen, key=lambda d: (d != "auto", d)) if len(seen) > 1 else []


def words(check: str, counts: dict[str, int]) -> str:
    """Every word of a cell with its count, as the check says it."""
    return " · ".join(f"{says(check, w)} {n:,}" for w, n in counts.items())


def family(data: dict, geometry: str) -> str:
    """The family a geometry's lines name (`packed@fp8_e4m3`); a pseudo geometry (`dense`, `*`) is its own."""
    return data["families"].get(geometry, geometry)


def label(geometry: str) -> str:
    """A geometry as a reader sees it (`*`, the release-wide outcomes: `whole release`)."""
    return "whole release" if geometry == "*" else geometry


def where(data: dict, geometries: tuple[str, ...]) -> str:
    """Geometries named, or past three counted per family."""
    if len(geometries) <= 3:
        return ", ".join(label(g) for g in geometries)
    families = Counter(family(data, g) for g in geometries)
    return f"{len(geometries)} geometries (" + ", ".join(f"{f} {n}" for f, n in families.items()) + ")"
