"""What the report's sections say, the same in report.md and report.html: the new findings by kind, what changed
since the previous report, the failures only one release, backend or cache dtype has, the runs folded, the known,
stale, unexercised and unsupported findings, the backends, the words a matrix's columns, rows and cells are read by,
and the performance lane's column, section and line under the verdict.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from harness.matrix import version_key
from harness.report import cells, keys, lone_failures
from harness.report.cells import Mark, says
from harness.report.fold import check_key, span
from harness.report.schema import Change, Counts, KnownCount, Presence, Report, ReportedFinding, Worst
from harness.results.timings import SLOWER, WITHIN
from harness.results.words import count

LEGEND = ("A cell reads passed/total result lines (every line in the cell, whatever its word), coloured by that "
          "fraction and red with any new failure or error; the other words are counted beside it under their marks "
          "(every word and count: Details); a cell where nothing passed reads as its worst mark; · nothing recorded.")
FIRST_GROUPS = 6  # kinds of new finding on the first screen; the rest under Details
REPROS_SHOWN = 2  # REPRO lines per kind; report.json's new_findings has each finding's
SHOWN = 20  # entries per list of changes or lone failures on the page; all of them are in report.json
API_TITLE = "Layout API changes: what a consumer can call"
API_NOTE = ("Against the recorded release before each release here: names of vLLM's layout modules and backend members "
            "that appeared, disappeared or changed signature or value (every release's: docs/releases.md).")
STALE_TITLE = "Stale known findings (applied, did not happen: remove or narrow them)"
UNEXERCISED_TITLE = ("Unexercised known findings (none of their examples ran: every one unsupported, not run, skipped "
                     "or not applicable, or none selected; neither confirmed nor stale)")
RUNS_HEAD = ("run", "subject", "contracts from", "releases", "lines", "checks", "written")
BENCH_COLUMN = "paged / dense (bench)"
BENCH_TITLE = "Performance (nox -s bench: paged / dense)"
BENCH_LEGEND = (f"{BENCH_COLUMN}: the worst paged / dense ratio of the release's timed cells (the performance "
                "lane, `nox -s bench`; never a conformance outcome, never the verdict's): ✓ within its limit, "
                "max(threshold, 1 + band); ✗ slower: a new performance finding; – not timed: a new finding too; "
                "◆ slower or not timed as a known performance finding predicts; ◌ a known performance finding that "
                "did not happen; the marks of its other cells beside it; · not benched.")
BENCH_NOTE = ("One row per release, workload and tile: the worst paged / dense ratio of its geometries (median over "
              "median, both over the same tokens), that geometry, the limit (max(threshold, 1 + band): the band is "
              "how far repeated dense runs spread), the roofline and every word with its count; the rows with a new "
              "finding (what fails `nox -s bench`) first. Not a conformance outcome: the verdict never counts them.")
BENCH_HEAD = ("release", "workload", "tile", "paged / dense", "geometry", "limit", "roofline", "words")
BENCH_STALE = "Stale known performance findings (applied, did not happen: remove or narrow them)"
UNCHECKED = "no conformance lines; benched"  # a subject's summary when only the performance lane has its lines
NO_LINE = "no line of this subject: nothing checked"  # a release x check row of a release the subject has no line of
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
    count: int  # findings (harness.report.keys.finding)
    lines: int  # the result lines they fold

    @property
    def word(self) -> str:
        """The outcome as its checks say it ("drift" for the drift check's differs)."""
        return " / ".join(dict.fromkeys(says(c, self.outcome) for c in self.checks))


def groups(data: Report) -> list[Group]:
    """The new findings by kind, worst first, then the most frequent."""
    by: dict[tuple, list[ReportedFinding]] = defaultdict(list)
    for r in data.new_findings:
        by[(r.subject, r.outcome, keys.kind(r.diagnosis))].append(r)
    out = []
    for (subject, outcome, _), rs in by.items():
        checks = sorted({r.check for r in rs}, key=check_key)
        firsts = {r.check: r.repro for r in reversed(rs) if r.repro}
        repros = dict.fromkeys([firsts[c] for c in checks if c in firsts] + [r.repro for r in rs if r.repro])
        out.append(Group(subject, outcome, rs[0].diagnosis, tuple(checks),
                         tuple(r for r in data.releases if r in {x.release for x in rs}),
                         tuple(g for g in data.geometries if g in {x.geometry for x in rs}), tuple(repros),
                         len(rs), sum(r.lines for r in rs)))
    return sorted(out, key=lambda g: (cells.rank(g.outcome), -g.count, g.subject, g.checks))


def headline(data: Report, g: Group) -> str:
    """A kind of new finding in one line: subject · checks · releases · geometries · how many findings (and result
    lines, where runs or replays folded several into one)."""
    lines = f" ({count(g.lines, 'result line')})" if g.lines != g.count else ""
    return (f"{g.subject} · {', '.join(g.checks)} · {span(g.releases, data.releases)} · "
            f"{where(data, g.geometries)} · {count(g.count, 'finding')}{lines}")


def subjects(data: Report) -> list[str]:
    """Every subject with result or performance lines: each has a release x check matrix (one only benched has its
    paged / dense column alone)."""
    return sorted({*data.checks, *data.performance})


def totals(data: Report, subject: str) -> dict[str, int]:
    """Every word of a subject with its count (none: only benched)."""
    total: Counter = Counter()
    for cs in data.checks.get(subject, {}).values():
        for counts in cs.values():
            total.update(counts)
    return dict(total)


def known(data: Report) -> list[tuple[str, str, str, str, int]]:
    """Known findings as (id, check, outcome, releases, count), one line per known finding, check and outcome."""
    by: dict[tuple[str, str, str], list[KnownCount]] = defaultdict(list)
    for k in data.known_findings:
        by[(k.id, k.check, k.outcome)].append(k)
    return [(i, c, says(c, o), span({k.release for k in ks}, data.releases), sum(k.count for k in ks))
            for (i, c, o), ks in sorted(by.items())]


def stale(data: Report) -> list[tuple[str, str, str]]:
    """Stale findings as (id, check, releases), one line per known finding and check."""
    by: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in data.stale_findings:
        by[(r.known, r.check)].append(r.release)
    return [(k, c, span(rs, data.releases)) for (k, c), rs in sorted(by.items())]


def unexercised(data: Report) -> list[tuple[str, str, str, str]]:
    """Unexercised findings as (id, check, releases, diagnosis: what their examples were instead), one line per known
    finding, check and diagnosis."""
    by: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in data.unexercised_findings:
        by[(r.known, r.check, r.diagnosis)].append(r.release)
    return [(k, c, span(rs, data.releases), d) for (k, c, d), rs in sorted(by.items())]


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


def _where_of(c: Change) -> str:
    backends = f" · {', '.join(c.backends)}" if c.backends else ""
    return f"{c.subject} · {c.release} · {c.check} · {label(c.geometry)}{backends}"


def change_sections(data: Report) -> list[Section]:
    """What changed since the previous report, one section per kind of change that has any (none: no changes)."""
    ch = data.changes
    if not ch:
        return []

    def presences(ps: tuple[Presence, ...]) -> list[Item]:
        by: dict[tuple[str, str], list[str]] = defaultdict(list)
        for p in ps:
            by[(p.subject, p.name)].append(p.release)
        return [Item(f"{s} · {label(n)} · {span(rs, data.releases)}") for (s, n), rs in sorted(by.items())]

    out = [_shown(count(len(ch.new_failures), "new failure"),
                  [Item(f"{_where_of(c)}: {c.before} → {c.after}", c.repro) for c in ch.new_failures],
                  red=True),
           _shown(count(len(ch.fixes), "fix"),
                  [Item(f"{_where_of(c)}: {c.before} → {c.after}") for c in ch.fixes]),
           _shown("Subjects appeared", [Item(x) for x in ch.subjects_appeared]),
           _shown("Subjects vanished", [Item(x) for x in ch.subjects_vanished]),
           _shown("Releases appeared", [Item(r) for r in ch.releases_appeared]),
           _shown("Releases vanished", [Item(r) for r in ch.releases_vanished]),
           _shown("Geometries appeared", presences(ch.geometries_appeared)),
           _shown("Geometries vanished", presences(ch.geometries_vanished)),
           _shown("Backends appeared", presences(ch.backends_appeared)),
           _shown("Backends vanished", presences(ch.backends_vanished)),
           _shown("Known findings gone stale", presences(ch.gone_stale)),
           _shown("Known findings gone unexercised", presences(ch.gone_unexercised))]
    return [s for s in out if s.items]


def lone_failure_sections(data: Report) -> list[Section]:
    """The failures only one release, backend or cache dtype has, one section per dimension that has any."""
    out = []
    for dimension in lone_failures.DIMENSIONS:
        found = [s for s in data.specific if s.dimension == dimension]
        items = [Item(f"{s.subject} · {s.check} · "
                      + " · ".join(f"{label(v) if f == 'geometry' else v}" for f, v in s.fixed if v)
                      + f": {s.outcome_class} on {s.where} only, of " + _among(data, dimension, s.among))
                 for s in found]
        if items:
            out.append(_shown(f"Only one {dimension} fails", items, red=any(
                s.outcome_class in cells.FAILING for s in found)))
    return out


def _among(data: Report, dimension: str, among: list[str]) -> str:
    if dimension != lone_failures.RELEASE:
        return f"{count(len(among), dimension)} ({', '.join(among)})"
    releases = span(among, data.releases)
    return releases if releases.startswith("all ") else f"{count(len(among), dimension)} ({releases})"


def backend_lines(data: Report) -> list[str]:
    """Per backend the releases and geometries whose lines name it (the run's: live probes name what they found)."""
    return [f"{b}: {span(by.releases, data.releases)} · {where(data, tuple(by.geometries))}"
            for b, by in data.backends.items()]


def runs_table(data: Report) -> list[list[str]]:
    """The Runs section's rows: run, subject, contracts from, releases, lines, checks, written (first – last)."""
    out = []
    for r in data.runs:
        lines = f"{r.lines:,} of {r.of:,} (partial)" if r.partial else f"{r.lines:,}"
        written = r.first if r.first == r.last else f"{r.first} – {r.last}"
        out.append([r.run, ", ".join(r.subjects), "/".join(r.sources), span(r.releases, data.releases),
                    lines, ", ".join(r.checks), written or "unknown"])
    return out


def source(data: Report, subject: str, release: str) -> str:
    """How the release's contracts were read for a subject's lines, from which vLLM build (harness.matrix.build: the
    installed one, or the one the recording was probed from), and which run they come from (and when it ran);
    lines of several runs say so, with each run's count. Only benched there: its performance lines' sources
    (`replay (bench)`). Neither: NO_LINE, so that its row never reads as a pass."""
    o = data.origins.get(subject, {}).get(release)
    if o is None:
        bench = data.performance.get(subject, {}).get(release)
        return f"{'/'.join(bench.sources)} (bench)" if bench else NO_LINE
    how = "/".join(o.sources) + "".join(f" of {b}" for b in o.builds)
    if len(o.runs) == 1:
        return f"{how}, run {o.runs[0].run} at {o.runs[0].time}"
    return f"{how}, lines from {len(o.runs)} runs: " + ", ".join(
        f"run {r.run} at {r.time} ({count(r.lines, 'line')})" for r in o.runs)


PINS_TITLE = "Last build that passed (a pin to copy)"


def pins(data: Report) -> list[str]:
    """Per subject: the newest release whose lines last passed, with its pin and build; then each release that does
    not pass now but did in an earlier report, with the build that passed there."""
    out, folded = [], {r.run for r in data.runs}
    for subject, by in data.last_passed.items():
        if now := [rel for rel, p in by.items() if p.run in folded]:
            p = by[now[-1]]
            out.append(f"{subject}: newest passing release {now[-1]}: `{p.pin}` ({p.build}, run "
                       f"{p.run} at {p.when})")
        out += [f"{subject}: {rel} not passing in this report (red, or not checked); last passed on "
                f"{p.build} (`{p.pin}`, run {p.run} at {p.when})"
                for rel, p in by.items() if p.run not in folded]
    return out


def columns(data: Report, subject: str) -> list[str]:
    """A subject's checks, the columns of its release x check matrix, in the declared order."""
    return sorted({c for cs in data.checks.get(subject, {}).values() for c in cs}, key=check_key)


def dtype_columns(data: Report, subject: str) -> list[str]:
    """A subject's cache dtypes, `auto` first; none when it ran with one only (no release x cache dtype matrix)."""
    seen = {d for ds in data.cache_dtypes.get(subject, {}).values() for d in ds}
    return sorted(seen, key=lambda d: (d != "auto", d)) if len(seen) > 1 else []


def words(check: str, counts: dict[str, int]) -> str:
    """Every word of a cell with its count, as the check says it."""
    return " · ".join(f"{says(check, w)} {n:,}" for w, n in counts.items())


def family(data: Report, geometry: str) -> str:
    """The family a geometry's lines name (`packed@fp8_e4m3`); a pseudo geometry (`dense`, `*`) is its own."""
    return data.families.get(geometry, geometry)


def label(geometry: str) -> str:
    """A geometry as a reader sees it (`*`, the release-wide outcomes: `whole release`)."""
    return "whole release" if geometry == "*" else geometry


def where(data: Report, geometries: tuple[str, ...]) -> str:
    """Geometries named, or past three counted per family."""
    if len(geometries) <= 3:
        return ", ".join(label(g) for g in geometries)
    families = Counter(family(data, g) for g in geometries)
    return f"{len(geometries)} geometries (" + ", ".join(f"{f} {n}" for f, n in families.items()) + ")"


def bench_releases(data: Report) -> list[str]:
    """Every release with performance lines, in release order (a release may be benched and not checked)."""
    return sorted({rel for by in data.performance.values() for rel in by}, key=version_key)


def benched(data: Report, subject: str) -> bool:
    """Whether a subject has performance lines: its release x check matrix has the paged / dense column."""
    return subject in data.performance


def bench_new(data: Report) -> int:
    """How many new performance findings (slower or not timed, no known finding predicts it) there are."""
    return sum(len(e.new_findings) for by in data.performance.values() for e in by.values())


def bench_verdict(data: Report) -> str:
    """The line under the verdict when there are new performance findings (else empty): the verdict never counts
    them."""
    if not (n := bench_new(data)):
        return ""
    return f"Performance: {count(n, 'new finding')} (nox -s bench fails on them; not a conformance outcome)"


def bench_words(counts: dict[str, int]) -> str:
    """Every performance word of some lines with its count, as report.json keeps them (worst first)."""
    return " · ".join(f"{w} {n:,}" for w, n in counts.items())


def _timed(cell: Worst | None) -> bool:
    return cell is not None and cell.outcome in (WITHIN, SLOWER)


@dataclass(frozen=True)
class Bench:
    """A paged / dense cell (a release's in the release x check matrix, a row's in the Performance section): the
    worst ratio with its mark (`1.28x ◆`; nothing timed: the worst mark and its count), red with any new performance
    finding among its lines, the marks of its other words beside it (a new finding is never hidden behind a known
    one's larger ratio), and every word with its count (the HTML's hover title)."""

    face: str
    red: bool
    tone: str  # its HTML colour class: red, else its face's mark's
    beside: tuple[tuple[Mark, int], ...]
    words: str


def _bench_cell(counts: Counts, worst: Worst | None, new: int) -> Bench:
    marks: Counter = Counter()
    for w, n in counts.items():  # worst first: so are the marks
        marks[cells.performance_mark(w)] += n
    if _timed(worst):
        face = cells.performance_mark(cells.performance_word(worst.outcome, worst.known))
        text = f"{worst.ratio:.2f}x {face.glyph}"
    else:
        face = next(iter(marks))
        text = f"{face.glyph}{marks[face]:,}"
    beside = tuple((m, n) for m, n in marks.items() if m is not face and m is not cells.PASS)
    return Bench(text, bool(new), "red" if new else face.name, beside, bench_words(counts))


def bench_cell(data: Report, subject: str, release: str) -> Bench | None:
    """A subject's paged / dense cell of one release (None: not benched)."""
    entry = data.performance.get(subject, {}).get(release)
    return None if entry is None else _bench_cell(entry.counts, entry.worst, len(entry.new_findings))


@dataclass(frozen=True)
class BenchRow:
    """A row of the Performance section: BENCH_HEAD's texts, its paged / dense one as a cell."""

    texts: tuple[str, ...]
    cell: Bench


def bench_rows(data: Report, subject: str) -> list[BenchRow]:
    """A subject's rows of the Performance section, one per release, workload and tile: those with a new finding
    first, then in release order, each release's in the order the lane wrote them. Geometry, limit and roofline are
    its worst timed cell's (nothing timed: its worst line's geometry)."""
    out = []
    for rel, entry in data.performance[subject].items():
        for r in entry.rows:
            w, cell = r.worst, _bench_cell(r.counts, r.worst, r.new_findings)
            limit, roofline = (f"{w.limit:.2f}x", w.roofline or "·") if _timed(w) else ("·", "·")
            out.append(BenchRow((rel, r.workload, r.tile, cell.face, w.geometry, limit, roofline,
                                 bench_words(r.counts)), cell))
    return sorted(out, key=lambda row: not row.cell.red)  # stable: release order kept within each half


def bench_stale(data: Report) -> list[str]:
    """Stale known performance findings, one line per finding and where its lines say it applied, with their
    releases."""
    by: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    for subject in sorted(data.performance):
        for rel, entry in data.performance[subject].items():
            for t in entry.stale_findings:
                by[(t.known, t.workload, t.tile, t.geometry)].append(rel)
    return [f"{k}: workload {w}, tile {t}, geometry {g} on {span(rs, bench_releases(data))}"
            for (k, w, t, g), rs in by.items()]
