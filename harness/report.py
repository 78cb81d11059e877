"""Fold every session's results into a report read like a conformance dashboard: what broke, what changed since the
last report, and where.

`python -m harness.report results [--out DIR] [--since OLD/report.json] [--run ID ...]` reads
results/<release>/results.jsonl (only the lines of the runs named, with --run) and writes, into the results folder
unless --out: report.md (the CI summary), report.html (the same report as one self-contained page with a drill-down
per cell and filters, harness.page) and report.json (every count, and the keys a later report compares against).
First a verdict (naming the runs it was folded from, when there are several) and the runs folded, each with its
lines per release (partial: other runs' lines are among them), then what changed since OLD (harness.changes) when
anything did, the new findings grouped by kind with their REPRO lines, the failures only one release, backend or
cache dtype has (harness.specific), then per subject a release x check and a release x cache dtype matrix whose cells
read passed/total (harness.cells); every outcome word with its count comes after, under Details. Outcome words are
never folded together, and an outcome a known finding predicted is marked `[known]` (see docs/report.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import api_history, cells, changes, checks, specific
from harness.cells import MARKS, Mark, says
from harness.matrix import version_key
from harness.results import STALE, Result, read

# Checks in their declared order (harness.checks): could a release be installed and read, the layout, the kernels.
CHECK_ORDER = tuple(c.name for c in checks.CHECKS)

LEGEND = ("A cell reads passed/total result lines (every line in the cell, whatever its word), coloured by that "
          "fraction and red with any new failure or error; the other words are counted beside it under their marks "
          "(every word and count: Details); a cell where nothing passed reads as its worst mark; · nothing recorded.")
FIRST_GROUPS = 6  # kinds of new finding on the first screen; the rest under Details
REPROS_SHOWN = 2  # REPRO lines per kind; all of them are in report.json's new_findings
ROW_REPROS = 3  # REPRO lines a drill-down row keeps (distinct, of its new and known findings)
SHOWN = 20  # entries per list of changes or specific failures on the page; all of them are in report.json
RUNS_NAMED = 4  # runs the verdict names; more are counted there and listed under Runs


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


def verdict(data: dict) -> str:
    """RED with how many new findings in how many releases, or GREEN: known and stale findings never make it red.
    Folded from more than one run, it names them (up to RUNS_NAMED; more are counted, and listed under Runs)."""
    new = data["new_findings"]
    where = {r["release"] for r in new}
    if not new:
        said = f"GREEN: no new findings in {count(len(data['releases']), 'release')}"
    else:
        said = f"RED: {count(len(new), 'new finding')} in {count(len(where), 'release')}"
    folded = data["runs"]
    if len(folded) <= 1:
        return said
    if len(folded) <= RUNS_NAMED:
        return f"{said} — from {len(folded)} runs: " + ", ".join(run_text(data, r) for r in folded)
    partial = sum(r["partial"] for r in folded)
    return f"{said} — from {len(folded)} runs ({partial} partial): see Runs"


def run_text(data: dict, r: dict) -> str:
    """A run in a few words: `run ID (replay, 0.25.1, 2026-12-01, partial: 131 of 1,548 lines)`."""
    lines = f"partial: {r['lines']:,} of {r['of']:,} lines" if r.get("partial") else count(r["lines"], "line")
    releases = span(r["releases"], sorted({*data["releases"], *r["releases"]}, key=version_key))
    return f"run {r['run']} ({'/'.join(r['sources'])}, {releases}, {r['last'][:10] or 'time unknown'}, {lines})"


def fold(rows: list[Result], since: Path | None = None, left_out: Iterable[Result] = (),
         recordings: Path = api_history.ROOT) -> dict:
    """The report as data: the runs folded, per subject a release x geometry, a release x check and a release x cache
    dtype matrix of word counts, the drill-down rows (subject, release, check, geometry, backends, cache dtype), each
    key's outcome class, the lists to act on, and, given the previous report.json `since`, what changed since it (a
    ValueError naming the file when it cannot be read or is not one). `left_out`: the lines of runs not folded (not
    named by --run), listed as such. `recordings`: where the layout API changes of the releases are read from
    (harness.api_history; a ValueError naming a recording that is not JSON)."""
    def table() -> dict[str, dict[str, dict[str, Counter]]]:  # subject -> release -> column -> word counts
        return defaultdict(lambda: defaultdict(lambda: defaultdict(Counter)))

    matrix, by_check, dtypes = table(), table(), table()
    origins: dict[tuple[str, str], list[Result]] = defaultdict(list)  # (subject, release) -> its lines
    family: dict[str, str] = {}  # geometry -> its family as a column head (with its cache dtype), read off the lines
    backends: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # backend -> releases, geometries
    drill: dict[tuple, Counter] = defaultdict(Counter)
    repros: dict[tuple, dict[str, None]] = defaultdict(dict)
    for r in rows:
        w = cells.word(r.outcome.value, r.known)
        matrix[r.subject][r.release][r.geometry][w] += 1
        by_check[r.subject][r.release][r.check][w] += 1
        key = (r.subject, r.release, r.check, r.geometry, r.backends, r.cache_dtype)
        drill[key][w] += 1
        # A row keeps its findings' REPRO lines: an unsupported case's would bury them.
        if r.repro and len(repros[key]) < ROW_REPROS and cells.outcome_class(w) in (*cells.FAILING, cells.KNOWN_CLASS):
            repros[key][r.repro] = None
        if r.family:
            dtypes[r.subject][r.release][r.cache_dtype][w] += 1
            family[r.geometry] = r.family + ("" if r.cache_dtype == "auto" else f"@{r.cache_dtype}")
        for b in r.backends:
            backends[b]["releases"].add(r.release)
            backends[b]["geometries"].add(r.geometry)
        origins[(r.subject, r.release)].append(r)
    new = [r for r in rows if cells.outcome_class(cells.word(r.outcome.value, r.known)) in cells.FAILING]
    known = Counter((r.known, r.release, r.geometry, r.check, r.outcome)
                    for r in rows if r.known and r.outcome != STALE)
    unsupported = Counter((r.subject, r.diagnosis) for r in rows if r.outcome == "unsupported")
    releases = sorted({r.release for r in rows}, key=version_key)
    first: dict[str, int] = {}  # a family's or geometry's first release: read in the order vLLM introduced them
    for r in rows:
        for key in {family.get(r.geometry, r.geometry), r.geometry}:
            first[key] = min(first.get(key, len(releases)), releases.index(r.release))
    geometries = sorted({r.geometry for r in rows},
                        key=lambda g: (g not in family, first[family.get(g, g)], first[g], g))

    def ordered(t: dict[str, dict[str, dict[str, Counter]]]) -> dict:
        return {s: {rel: {k: _by_rank(c) for k, c in ks.items()} for rel, ks in by_rel.items()}
                for s, by_rel in t.items()}

    data = {
        "schema": changes.REPORT_SCHEMA,
        "releases": releases,
        "runs": runs(rows, {k: len(v) for k, v in origins.items()}),
        "left_out": runs(list(left_out)),
        "origins": {s: {rel: _origin(origins[(s, rel)]) for rel in releases if (s, rel) in origins}
                    for s in sorted({s for s, _ in origins})},
        "geometries": geometries,
        "families": family,
        "orders": {r.geometry: r.order for r in rows if r.order},
        "matrix": ordered(matrix),
        "checks": ordered(by_check),
        "cache_dtypes": ordered(dtypes),
        "backends": {b: {"releases": [r for r in releases if r in by["releases"]],
                         "geometries": [g for g in geometries if g in by["geometries"]]}
                     for b, by in sorted(backends.items())},
        "rows": [{"subject": s, "release": rel, "check": c, "geometry": g, "backends": list(bs), "cache_dtype": d,
                  "counts": _by_rank(n), "repros": list(repros[(s, rel, c, g, bs, d)])}
                 for (s, rel, c, g, bs, d), n in sorted(drill.items(), key=lambda kv: (
                     kv[0][0], releases.index(kv[0][1]), check_key(kv[0][2]), geometries.index(kv[0][3]),
                     kv[0][4], kv[0][5]))],
        "new_findings": [_plain(r) for r in new],
        "known_findings": [dict(zip(("id", "release", "geometry", "check", "outcome"), k), count=n)
                           for k, n in sorted(known.items())],
        "stale_findings": [_plain(r) for r in rows if r.outcome == STALE],
        "unsupported": [{"subject": s, "reason": d, "count": n} for (s, d), n in unsupported.most_common()],
    }
    classes = changes.keys(data["rows"])
    data["keys"] = changes.encode(classes)
    dtype_order = sorted({r.cache_dtype for r in rows if r.cache_dtype}, key=lambda d: (d != "auto", d))
    data["specific"] = _as_json([asdict(x) for x in specific.find(classes, {
        specific.RELEASE: releases, "check": list(CHECK_ORDER), specific.BACKEND: sorted(backends),
        specific.CACHE_DTYPE: dtype_order})])
    data["api_changes"] = [{"release": s.release, "before": s.before,
                            "said": {k: t for k in api_history.KINDS if (t := api_history.said(s, k))},
                            "changes": _as_json([asdict(c) for c in s.changes])}
                           for s in api_history.history(recordings, releases) if s.changes]
    data["verdict"] = verdict(data)
    if since is not None:
        data["changes"] = _as_json(asdict(changes.compare(changes.load(since), data, since)))
    return data


def runs(rows: list[Result], totals: dict[tuple[str, str], int] | None = None) -> list[dict]:
    """Each run among `rows`, oldest first: its id, subjects, sources, when its first and last lines were written,
    its lines per release, its checks; with `totals` ((subject, release) -> lines folded), `of` (the lines of its
    subjects in its releases) and `partial` (other runs' lines are among them)."""
    by: dict[str, list[Result]] = defaultdict(list)
    for r in rows:
        by[r.run].append(r)
    out = []
    for run, rs in by.items():
        times = sorted(r.time for r in rs if r.time)
        releases = Counter(r.release for r in rs)
        entry = {"run": run, "subjects": sorted({r.subject for r in rs}),
                 "sources": sorted({r.source for r in rs}), "first": times[0] if times else "",
                 "last": times[-1] if times else "", "lines": len(rs),
                 "releases": {rel: releases[rel] for rel in sorted(releases, key=version_key)},
                 "checks": sorted({r.check for r in rs}, key=check_key)}
        if totals is not None:
            entry["of"] = sum(totals[(s, rel)] for s in entry["subjects"] for rel in releases)
            entry["partial"] = entry["of"] > len(rs)
        out.append(entry)
    return sorted(out, key=lambda e: (e["first"], e["run"]))


def _origin(rows: list[Result]) -> dict:
    """Where a subject's lines of one release come from: their sources, and each run with its lines and when the
    last of them was written."""
    lines = Counter(r.run for r in rows)
    last: dict[str, str] = {}
    for r in rows:
        last[r.run] = max(last.get(r.run, ""), r.time)
    return {"sources": sorted({r.source for r in rows}),
            "runs": [{"run": run, "time": last[run] or "unknown", "lines": n}
                     for run, n in sorted(lines.items(), key=lambda kv: (last[kv[0]], kv[0]))]}


def _as_json(value):
    """`value` as report.json holds it (tuples as lists), so that what is rendered from fold's data and from a
    report.json read back is the same."""
    return json.loads(json.dumps(value))


def _by_rank(counts: Counter) -> dict[str, int]:
    """Word counts, the worst word first."""
    return dict(sorted(counts.items(), key=lambda kv: cells.rank(kv[0])))


def _plain(r: Result) -> dict:
    return {**asdict(r), "outcome": r.outcome.value}


def family(data: dict, geometry: str) -> str:
    """The family a geometry's lines name (`packed@fp8_e4m3`); a pseudo geometry (`dense`, `*`) is its own."""
    return data["families"].get(geometry, geometry)


def label(geometry: str) -> str:
    return "whole release" if geometry == "*" else geometry


def count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def span(subset: Iterable[str], releases: list[str]) -> str:
    """Releases as runs of the report's release order: `0.9.2–0.11.2, 0.33.0` (all of them: `all N releases`)."""
    chosen = set(subset)
    if chosen == set(releases) and len(releases) > 1:
        return f"all {len(releases)} releases ({releases[0]}–{releases[-1]})"
    runs: list[list[str]] = []
    for i, r in enumerate(releases):
        if r in chosen:
            if runs and releases.index(runs[-1][-1]) == i - 1:
                runs[-1].append(r)
            else:
                runs.append([r])
    return ", ".join(", ".join(run) if len(run) <= 2 else f"{run[0]}–{run[-1]}" for run in runs)


def where(data: dict, geometries: tuple[str, ...]) -> str:
    if len(geometries) <= 3:
        return ", ".join(label(g) for g in geometries)
    families = Counter(family(data, g) for g in geometries)
    return f"{len(geometries)} geometries (" + ", ".join(f"{f} {n}" for f, n in families.items()) + ")"


def check_key(check: str) -> tuple[int, str]:
    return (CHECK_ORDER.index(check) if check in CHECK_ORDER else len(CHECK_ORDER), check)


def columns(data: dict, subject: str) -> list[str]:
    return sorted({c for cs in data["checks"][subject].values() for c in cs}, key=check_key)


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


def runs_table(data: dict) -> list[list[str]]:
    """The Runs section's rows: run, subject, contracts from, releases, lines, checks, written (first – last)."""
    out = []
    for r in data["runs"]:
        lines = f"{r['lines']:,} of {r['of']:,} (partial)" if r["partial"] else f"{r['lines']:,}"
        written = r["first"] if r["first"] == r["last"] else f"{r['first']} – {r['last']}"
        out.append([r["run"], ", ".join(r["subjects"]), "/".join(r["sources"]), span(r["releases"], data["releases"]),
                    lines, ", ".join(r["checks"]), written or "unknown"])
    return out


API_TITLE = "Layout API changes: what a consumer can call"
API_NOTE = ("Against the recorded release before each release here: names of vLLM's layout modules and backend members "
            "that appeared, disappeared or changed signature or value (every release's: docs/releases.md).")
RUNS_HEAD = ("run", "subject", "contracts from", "releases", "lines", "checks", "written")
RUNS_NOTE = ("partial: the lines of its releases come from more than one run (a narrower run re-checked some items, "
             "an earlier run's other lines stay); `python -m harness.report --run ID` folds only the runs named.")


def totals(data: dict, subject: str) -> dict[str, int]:
    """Every word of a subject with its count."""
    total: Counter = Counter()
    for cs in data["checks"][subject].values():
        for counts in cs.values():
            total.update(counts)
    return dict(total)


def headline(data: dict, g: Group) -> str:
    return (f"{g.subject} · {', '.join(g.checks)} · {span(g.releases, data['releases'])} · "
            f"{where(data, g.geometries)} · {count(g.count, 'result')}")


def stale(data: dict) -> list[tuple[str, str, str]]:
    """Stale findings as (id, check, releases), one line per known finding and check."""
    by: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in data["stale_findings"]:
        by[(r["known"], r["check"])].append(r["release"])
    return [(k, c, span(rs, data["releases"])) for (k, c), rs in sorted(by.items())]


def known(data: dict) -> list[tuple[str, str, str, str, int]]:
    """Known findings as (id, check, outcome, releases, count), one line per known finding, check and outcome."""
    by: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for k in data["known_findings"]:
        by[(k["id"], k["check"], k["outcome"])].append(k)
    return [(i, c, says(c, o), span({k["release"] for k in ks}, data["releases"]), sum(k["count"] for k in ks))
            for (i, c, o), ks in sorted(by.items())]


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
           _shown(f"{len(ch['fixes']):,} fix{'' if len(ch['fixes']) == 1 else 'es'}",
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


def specific_sections(data: dict) -> list[Section]:
    """The failures only one release, backend or cache dtype has, one section per dimension that has any."""
    out = []
    for dimension in specific.DIMENSIONS:
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
    if dimension != specific.RELEASE:
        return f"{count(len(among), dimension)} ({', '.join(among)})"
    releases = span(among, data["releases"])
    return releases if releases.startswith("all ") else f"{count(len(among), dimension)} ({releases})"


def backend_lines(data: dict) -> list[str]:
    """Per backend the releases and geometries whose lines name it (the run's: live probes name what they found)."""
    return [f"{b}: {span(by['releases'], data['releases'])} · {where(data, tuple(by['geometries']))}"
            for b, by in data["backends"].items()]


# ---------------------------------------------------------------------------------------------------- markdown


def _md_mark(m: Mark, n: int | None = None) -> str:
    text = m.glyph + ("" if n is None else f"{n:,}")
    return f"**{text}**" if m.red else text  # no colour in markdown: red marks are bold


def md_cell(counts: dict[str, int]) -> str:
    """A cell as markdown: its face (bold when red) and the marks counted beside it."""
    c = cells.cell(counts)
    if c is None:
        return "·"
    face = f"**{c.face}**" if c.red else c.face
    return " ".join([face, *(_md_mark(m, n) for m, n in c.beside)])


def _md_group(data: dict, g: Group) -> list[str]:
    lines = [f"- **{cells.mark(g.outcome).glyph} {g.word}** · {headline(data, g)}  ",
             f"  {g.diagnosis}"]
    if g.repros:
        lines += ["", "  ```", *(f"  {r}" for r in g.repros[:REPROS_SHOWN]), "  ```"]
    if len(g.repros) > REPROS_SHOWN:
        lines.append(f"  +{len(g.repros) - REPROS_SHOWN:,} more REPRO lines (report.json `new_findings`)")
    return lines


def _md_section(s: Section, level: str = "###") -> list[str]:
    lines = ["", f"{level} {'**' + s.title + '**' if s.red else s.title}", ""]
    for item in s.items:
        lines.append(f"- {item.text}")
        if item.repro:
            lines += ["", "  ```", f"  {item.repro}", "  ```"]
    if s.more:
        lines.append(f"- +{s.more:,} more (report.json)")
    return lines


def dtype_columns(data: dict, subject: str) -> list[str]:
    seen = {d for ds in data["cache_dtypes"].get(subject, {}).values() for d in ds}
    return sorted(seen, key=lambda d: (d != "auto", d)) if len(seen) > 1 else []


def _md_dtypes(data: dict, subject: str) -> list[str]:
    columns = dtype_columns(data, subject)
    if not columns:
        return []
    out = ["", f"#### {subject}: release × cache dtype", "", "| release | " + " | ".join(columns) + " |",
           "|---|" + "---|" * len(columns)]
    for release in data["releases"]:
        ds = data["cache_dtypes"][subject].get(release, {})
        out.append(f"| {release} | " + " | ".join(md_cell(ds.get(d, {})) for d in columns) + " |")
    return out


def _summary(data: dict, subject: str) -> tuple[str, list[tuple[Mark, int]]]:
    """A subject's totals: `passed/total passed` and every other mark with its count."""
    c = cells.cell(totals(data, subject))
    return f"{c.passed:,}/{c.total:,} passed", list(c.others)


def markdown(data: dict) -> str:
    releases, kinds = data["releases"], groups(data)
    lines = ["# kvconform conformance report", "", f"**{data['verdict']}**", ""]
    for subject in sorted(data["checks"]):
        passed, others = _summary(data, subject)
        lines.append(f"- {subject}: {passed} — " + " · ".join(f"{_md_mark(m, n)} {m.name}" for m, n in others))
    lines += ["", f"## Runs folded ({len(data['runs'])})", "", "| " + " | ".join(RUNS_HEAD) + " |",
              "|---" * len(RUNS_HEAD) + "|", *("| " + " | ".join(row) + " |" for row in runs_table(data))]
    lines += ["", RUNS_NOTE] if any(r["partial"] for r in data["runs"]) else []
    if data["left_out"]:
        lines += ["", "Not folded (no `--run` names them): " + ", ".join(run_text(data, r) for r in data["left_out"])]
    if sections := change_sections(data):
        lines += ["", f"## Since {data['changes']['since']} ({data['changes']['since_verdict']})"]
        for s in sections:
            lines += _md_section(s)
    elif "changes" in data:
        lines += ["", f"Since {data['changes']['since']}: no changes."]
    if kinds:
        lines += ["", "## What broke (new findings, worst first)", ""]
        for g in kinds[:FIRST_GROUPS]:
            lines += _md_group(data, g)
        if len(kinds) > FIRST_GROUPS:
            lines.append(f"- +{len(kinds) - FIRST_GROUPS} more kinds of new finding: under Details")
    for s in specific_sections(data):
        lines += _md_section(s, "##")
    lines += ["", "## Where: release × check", "", LEGEND + " " + " · ".join(
        f"{_md_mark(m)} {m.name} ({m.meaning})" for m in MARKS) + "."]
    for subject in sorted(data["checks"]):
        cols = columns(data, subject)
        lines += ["", f"### {subject}", "", "| release | contracts from | " + " | ".join(cols)
                  + " |", "|---|---|" + "---|" * len(cols)]
        for release in releases:
            cs = data["checks"][subject].get(release, {})
            lines.append(f"| {release} | {source(data, subject, release)} | "
                         + " | ".join(md_cell(cs.get(check, {})) for check in cols) + " |")
        lines += _md_dtypes(data, subject)
    if data["api_changes"]:
        lines += ["", f"## {API_TITLE}", "", API_NOTE, ""]
        lines += [f"- **{a['release']}** (against {a['before']}): "
                  + " · ".join(f"{k}: {t}" for k, t in a["said"].items()) for a in data["api_changes"]]
    lines += ["", "## Known findings (green, reported)", ""]
    lines += [f"- {i}: {c} {o} on {rs}, x{n:,}" for i, c, o, rs, n in known(data)] or ["none"]
    lines += ["", "## Stale known findings (applied, did not happen: remove or narrow them)", ""]
    lines += [f"- {i}: {c} on {rs}" for i, c, rs in stale(data)] or ["none"]
    lines += ["", "## Unsupported (the subject's reasons)", ""]
    lines += [f"- {u['subject']}: {u['reason']} x{u['count']:,}" for u in data["unsupported"]] or ["none"]
    lines += ["", "## Backends (as the folded result lines name them)", ""]
    lines += [f"- {b}" for b in backend_lines(data)] or ["none recorded"]
    lines += ["", "## Details"]
    if len(kinds) > FIRST_GROUPS:
        lines += ["", "### More new findings", ""]
        for g in kinds[FIRST_GROUPS:]:
            lines += _md_group(data, g)
    for subject in sorted(data["checks"]):
        cols = columns(data, subject)
        lines += ["", f"### {subject}: every outcome word per release and check", "",
                  "| release | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for release in releases:
            cs = data["checks"][subject].get(release, {})
            lines.append(f"| {release} | " + " | ".join(words(check, cs[check]) if check in cs else "·"
                                                        for check in cols) + " |")
        by_release = data["matrix"][subject]
        geometries = [g for g in data["geometries"] if any(g in gs for gs in by_release.values())]
        lines += ["", f"### {subject}: release × geometry", "",
                  "| release | " + " | ".join(label(g).replace(":", "<br>") for g in geometries) + " |",
                  "|---|" + "---|" * len(geometries)]
        for release in releases:
            gs = by_release.get(release, {})
            lines.append(f"| {release} | " + " | ".join(md_cell(gs.get(g, {})) for g in geometries) + " |")
    return "\n".join(lines) + "\n"


def words(check: str, counts: dict[str, int]) -> str:
    """Every word of a cell with its count, as the check says it."""
    return " · ".join(f"{says(check, w)} {n:,}" for w, n in counts.items())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--since", type=Path, default=None, metavar="OLD/report.json",
                        help="a previous report.json: what changed since it comes first")
    parser.add_argument("--run", action="append", default=[], metavar="ID",
                        help="fold only this run's lines (repeatable); the Runs section names the others")
    args = parser.parse_args(argv)
    from harness import page  # the page reads this module's folds and texts

    try:
        rows = read(args.results)
        if not rows:
            print(f"no results under {args.results} (expected <release>/results.jsonl)", file=sys.stderr)
            return 1
        known = [r["run"] for r in runs(rows)]
        if unknown := [x for x in args.run if x not in known]:
            raise ValueError(f"--run {', '.join(unknown)}: no such run under {args.results}; its runs: "
                             + ", ".join(known))
        chosen = set(args.run or known)
        data = fold([r for r in rows if r.run in chosen], args.since, [r for r in rows if r.run not in chosen])
    except ValueError as e:  # a line, report or recording this kvconform cannot read (it names the file), or a --run
        print(f"python -m harness.report: {e}", file=sys.stderr)
        return 2
    out = args.out or args.results
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "report.md").write_text(markdown(data))
    (out / "report.html").write_text(page.html_page(data))
    print(f"{out / 'report.md'}, report.html: {data['verdict']}; {sum(r['lines'] for r in data['runs'])} results, "
          f"{count(len(data['releases']), 'release')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
