"""The report as data: every result line folded into what report.json holds (the runs folded, per subject the
release x geometry, release x check and release x cache dtype word counts, the drill-down rows, each key's outcome
class, the lists to act on, the verdict) and, given a previous report.json, what changed since it; beside them, the
performance lane's lines (harness.results.timings), which never change the verdict.

Outcome words are never folded together: a known finding's keeps ` [known]` after it (harness.report.cells).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import fields, replace
from pathlib import Path

from harness import checks
from harness.matrix import version_key
from harness.recordings import api_history
from harness.report import cells, changes, history, keys
from harness.report.lone_failures import BACKEND, CACHE_DTYPE, RELEASE, lone_failures
from harness.report.schema import (REPORT_SCHEMA, ApiRelease, Benched, BenchedRow, Counts, DrillRow, KnownCount,
                                   Provenance, Report, ReportedFinding, Run, RunLines, Seen, Table, Unsupported, Worst)
from harness.results import STALE, UNEXERCISED, Result
from harness.results.timings import SLOWER, WITHIN, Timing
from harness.results.words import count

# Checks in their declared order (harness.checks): could a release be installed and read, the layout, the kernels.
CHECK_ORDER = tuple(c.name for c in checks.CHECKS)
ROW_REPROS = 3  # REPRO lines a drill-down row keeps (distinct, of its new and known findings)
RUNS_NAMED = 4  # runs the verdict names; more are counted there and listed under Runs


def verdict(data: Report) -> str:
    """RED with how many new findings (one per finding, harness.report.keys.finding) in how many releases, or GREEN
    with how many releases something was checked in, naming the others (`unchecked`): known, stale and unexercised
    findings never make it red, but the unexercised ones are counted after it (a refusal must not read as a plain
    GREEN); with no result line at all (the performance lane's lines, or connector results, only), NO CONFORMANCE
    RESULTS, never GREEN.
    Folded from more than one run, it names them (up to RUNS_NAMED; more are counted, and listed under Runs). Lines of
    several subjects are never folded into one verdict: each subject gets its own."""
    if not data.runs and not data.releases:  # the folder's connector table alone (harness.report.connectors)
        return "NO CONFORMANCE RESULTS: only connector results (nox -s connectors), under Connectors"
    if not data.runs:
        return ("NO CONFORMANCE RESULTS: only the performance lane's lines (nox -s bench) in "
                + count(len(data.releases), "release"))
    subjects = sorted({r.subject for r in data.rows})
    if len(subjects) > 1:
        each = {s: _said(data, s) for s in subjects}
        red = sum(v.startswith("RED") for v in each.values())
        head = f"RED for {red} of {len(subjects)} subjects" if red else f"GREEN for each of {len(subjects)} subjects"
        said = f"{head} (--subject NAME reports one): " + "; ".join(f"{s} {v}" for s, v in each.items())
    else:
        said = _said(data, subjects[0])
    folded = data.runs
    if len(folded) <= 1:
        return said
    if len(folded) <= RUNS_NAMED:
        return f"{said} — from {len(folded)} runs: " + ", ".join(run_text(data, r) for r in folded)
    partial = sum(r.partial for r in folded)
    return f"{said} — from {len(folded)} runs ({partial} partial): see Runs"


def _said(data: Report, subject: str) -> str:
    """GREEN or RED with its counts, over one subject's lines; GREEN names the releases nothing of it was checked in."""
    new = [r for r in data.new_findings if r.subject == subject]
    nothing = data.unchecked[subject]
    if not new:
        checked = {rel for r in data.runs for rel in r.releases} - set(nothing)
        said = f"GREEN: no new findings in {count(len(checked), 'release')}"
        if nothing:
            by: dict[str, list[str]] = defaultdict(list)
            for rel, why in nothing.items():
                by[why].append(rel)
            said += "; nothing checked in " + ", ".join(f"{span(rs, data.releases)} ({why})"
                                                         for why, rs in by.items())
    else:
        said = f"RED: {count(len(new), 'new finding')} in {count(len({r.release for r in new}), 'release')}"
    if unexercised := {(r.subject, r.known) for r in data.unexercised_findings if r.subject == subject}:
        said += f"; {count(len(unexercised), 'unexercised known finding')}"
    return said


def run_text(data: Report, r: Run) -> str:
    """A run in a few words: `run ID (replay, 0.25.1, 2026-12-01, partial: 131 of 1,548 lines)`."""
    lines = f"partial: {r.lines:,} of {r.of:,} lines" if r.partial else count(r.lines, "line")
    releases = span(r.releases, sorted({*data.releases, *r.releases}, key=version_key))
    return f"run {r.run} ({'/'.join(r.sources)}, {releases}, {r.last[:10] or 'time unknown'}, {lines})"


def report_data(rows: list[Result], since: Sequence[Path] = (), left_out: Iterable[Result] = (),
                recordings: Path = api_history.ROOT, timings: Iterable[Timing] = ()) -> Report:
    """The report as data: the runs folded, per subject a release x geometry, a release x check and a release x cache
    dtype matrix of word counts, the drill-down rows (subject, release, check, geometry, backends, cache dtype), each
    key's outcome class, the lists to act on, each cell's history and the last build that passed
    (harness.report.history), and, given earlier report.json files `since` (oldest first), what changed since the last
    of them (a ValueError naming a file that cannot be read or is not one). `left_out`: the lines of runs not folded
    (not named by --run), listed as such. `recordings`: where the layout API changes of the releases are read from
    (harness.recordings.api_history; a ValueError naming a recording that is not JSON). `timings`: the performance
    lane's lines (harness.results.timings.read), the report's `performance` (see `performance`); they never change the
    verdict, but a release they have is one of the report's `releases` (a row of every subject's release x check
    matrix)."""
    timings = list(timings)
    def table() -> dict[str, dict[str, dict[str, Counter]]]:  # subject -> release -> column -> word counts
        return defaultdict(lambda: defaultdict(lambda: defaultdict(Counter)))

    matrix, by_check, dtypes = table(), table(), table()
    origins: dict[tuple[str, str], list[Result]] = defaultdict(list)  # (subject, release) -> its lines
    family: dict[str, str] = {}  # geometry -> its family as a column head (with its cache dtype), read off the lines
    # backend -> the releases and the geometries whose lines name it
    backend_releases: dict[str, set[str]] = defaultdict(set)
    backend_geometries: dict[str, set[str]] = defaultdict(set)
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
            backend_releases[b].add(r.release)
            backend_geometries[b].add(r.geometry)
        origins[(r.subject, r.release)].append(r)
    new = [r for r in rows if cells.outcome_class(cells.word(r.outcome.value, r.known)) in cells.FAILING]
    known = Counter((r.known, r.release, r.geometry, r.check, r.outcome)
                    for r in rows if r.known and r.outcome not in (STALE, UNEXERCISED))
    unsupported = Counter((r.subject, r.diagnosis) for r in rows if r.outcome == "unsupported")
    releases = sorted({r.release for r in rows} | {t.release for t in timings}, key=version_key)
    first: dict[str, int] = {}  # a family's or geometry's first release: read in the order vLLM introduced them
    for r in rows:
        for key in {family.get(r.geometry, r.geometry), r.geometry}:
            first[key] = min(first.get(key, len(releases)), releases.index(r.release))
    geometries = sorted({r.geometry for r in rows},
                        key=lambda g: (g not in family, first[family.get(g, g)], first[g], g))

    def ordered(t: dict[str, dict[str, dict[str, Counter]]]) -> Table:
        return {s: {rel: {k: _by_rank(c) for k, c in ks.items()} for rel, ks in by_rel.items()}
                for s, by_rel in t.items()}

    rows_of = tuple(DrillRow(s, rel, c, g, bs, d, _by_rank(n), tuple(repros[(s, rel, c, g, bs, d)]))
                    for (s, rel, c, g, bs, d), n in sorted(drill.items(), key=lambda kv: (
                        kv[0][0], releases.index(kv[0][1]), check_key(kv[0][2]), geometries.index(kv[0][3]),
                        kv[0][4], kv[0][5])))
    classes = keys.classes(rows_of)
    dtype_order = sorted({r.cache_dtype for r in rows if r.cache_dtype}, key=lambda d: (d != "auto", d))
    checked = {rel for _, rel in origins}  # a release only benched was never checked
    by_check_ordered = ordered(by_check)
    data = Report(
        schema=REPORT_SCHEMA,
        releases=tuple(releases),
        runs=runs(rows, {k: len(v) for k, v in origins.items()}),
        left_out=runs(list(left_out)),
        origins={s: {rel: _origin(origins[(s, rel)]) for rel in releases if (s, rel) in origins}
                 for s in sorted({s for s, _ in origins})},
        geometries=tuple(geometries),
        families=family,
        orders={r.geometry: r.order for r in rows if r.order},
        matrix=ordered(matrix),
        checks=by_check_ordered,
        cache_dtypes=ordered(dtypes),
        backends={b: Seen(tuple(r for r in releases if r in rs),
                          tuple(g for g in geometries if g in backend_geometries[b]))
                  for b, rs in sorted(backend_releases.items())},
        rows=rows_of,
        new_findings=findings(new),
        known_findings=tuple(KnownCount(i, rel, g, c, o.value, n) for (i, rel, g, c, o), n in sorted(known.items())),
        stale_findings=tuple(r for r in rows if r.outcome == STALE),
        unexercised_findings=tuple(r for r in rows if r.outcome == UNEXERCISED),
        unsupported=tuple(Unsupported(s, d, n) for (s, d), n in unsupported.most_common()),
        keys=keys.encoded(classes),
        specific=tuple(lone_failures(classes, {RELEASE: releases, "check": list(CHECK_ORDER),
                                               BACKEND: sorted(backend_releases), CACHE_DTYPE: dtype_order})),
        unchecked=unchecked(by_check_ordered, [rel for rel in releases if rel in checked]),
        api_changes=tuple(ApiRelease(s.release, s.before,
                                     {k: t for k in api_history.KINDS if (t := api_history.said(s, k))}, s.changes)
                          for s in api_history.history(recordings, releases) if s.changes),
        performance=performance(timings),
        verdict="")
    # The conformance lines' verdict only: a performance finding fails `nox -s bench` instead.
    data = replace(data, verdict=verdict(data))
    earlier = [(str(p), changes.load(p)) for p in since]
    data = replace(data, history=history.history(earlier),
                   last_passed=history.last_passed(data, rows, earlier[-1][1] if earlier else None))
    if earlier:
        data = replace(data, changes=changes.compare(earlier[-1][1], data, since[-1]))
    return data


def unchecked(by_check: Table, releases: list[str]) -> dict[str, dict[str, str]]:
    """Per subject (of `by_check`, the report's `checks`), each of `releases` (those with result lines) where nothing
    of it was checked, in release order, with why: `no line` of it there, or `only` the words its lines have (none
    passed or failed: unsupported, not-run, skipped, not-applicable, a known finding unexercised)."""
    out = {}
    for subject, by in by_check.items():
        out[subject] = {}
        for rel in releases:
            words = sorted({w for counts in by.get(rel, {}).values() for w in counts}, key=cells.rank)
            if not any(cells.outcome_class(w) in cells.CHECKED for w in words):
                out[subject][rel] = f"only {', '.join(words)}" if words else "no line"
    return out


def performance(lines: Iterable[Timing]) -> dict[str, dict[str, Benched]]:
    """The performance lane's lines as the report's `performance`: per subject, per release (in release order) the
    word counts of its lines (`counts`, worst first), its worst cell (`worst`: the timed one with the largest paged /
    dense ratio, None when none was timed), one row per (workload, tile) in the order the lane wrote them (`rows`: its
    counts, how many new findings, its worst cell, else its worst line), its new and its stale performance findings
    (`new_findings`, `stale_findings`: the full lines), and where its contracts came from (`sources`: the matrix's
    "contracts from" where the subject has no result line of the release)."""
    by: dict[str, dict[str, list[Timing]]] = defaultdict(lambda: defaultdict(list))
    for t in lines:
        by[t.subject][t.release].append(t)
    return {s: {rel: _bench(by[s][rel]) for rel in sorted(by[s], key=version_key)} for s in sorted(by)}


def _bench(lines: list[Timing]) -> Benched:
    """One subject's performance lines of one release, as `performance` holds them."""
    rows: dict[tuple[str, str], list[Timing]] = defaultdict(list)
    for t in lines:
        if t.outcome != STALE:  # a stale line is a known finding's, no cell's: listed apart
            rows[(t.workload, t.tile)].append(t)
    worst = _worst(lines)
    return Benched(
        _bench_counts(lines), _bench_cell(worst) if worst else None,
        tuple(BenchedRow(w, tile, _bench_counts(ts), sum(t.new_finding for t in ts),
                         _bench_cell(_worst(ts) or min(ts, key=lambda t: cells.performance_rank(_word(t)))))
              for (w, tile), ts in rows.items()),
        tuple(t for t in lines if t.new_finding), tuple(t for t in lines if t.outcome == STALE),
        tuple(sorted({t.source for t in lines})))


def _word(t: Timing) -> str:
    return cells.performance_word(t.outcome, t.known)


def _worst(lines: list[Timing]) -> Timing | None:
    """The timed line with the largest paged / dense ratio (a not-timed or stale line has no ratio)."""
    return max((t for t in lines if t.outcome in (WITHIN, SLOWER)), key=lambda t: t.ratio, default=None)


def _bench_counts(lines: list[Timing]) -> Counts:
    return dict(sorted(Counter(map(_word, lines)).items(), key=lambda kv: cells.performance_rank(kv[0])))


def _bench_cell(t: Timing) -> Worst:
    return Worst(t.ratio, t.geometry, t.workload, t.tile, t.outcome, t.known, t.band, t.limit, t.roofline,
                 t.diagnosis)


def runs(rows: list[Result], totals: dict[tuple[str, str], int] | None = None) -> tuple[Run, ...]:
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
        subjects = tuple(sorted({r.subject for r in rs}))
        # .get: a run of several subjects need not have lines of each of them in each of its releases
        of = 0 if totals is None else sum(totals.get((s, rel), 0) for s in subjects for rel in releases)
        out.append(Run(run, subjects, tuple(sorted({r.source for r in rs})), times[0] if times else "",
                       times[-1] if times else "", len(rs),
                       {rel: releases[rel] for rel in sorted(releases, key=version_key)},
                       tuple(sorted({r.check for r in rs}, key=check_key)), of, of > len(rs)))
    return tuple(sorted(out, key=lambda e: (e.first, e.run)))


def _origin(rows: list[Result]) -> Provenance:
    """Where a subject's lines of one release come from: their sources, and each run with its lines and when the
    last of them was written."""
    lines = Counter(r.run for r in rows)
    last: dict[str, str] = {}
    for r in rows:
        last[r.run] = max(last.get(r.run, ""), r.time)
    return Provenance(tuple(sorted({r.source for r in rows})),
                      tuple(dict.fromkeys(r.build for r in rows if r.build)),
                      tuple(RunLines(run, last[run] or "unknown", n)
                            for run, n in sorted(lines.items(), key=lambda kv: (last[kv[0]], kv[0]))))


def _by_rank(counts: Counter) -> Counts:
    """Word counts, the worst word first."""
    return dict(sorted(counts.items(), key=lambda kv: cells.rank(kv[0])))


def findings(new: list[Result]) -> tuple[ReportedFinding, ...]:
    """The new findings, one per finding (harness.report.keys.finding), in the order their first lines were written:
    each its newest line with a REPRO line (else its newest), with `lines`, how many result lines it folds."""
    by: dict[tuple, list[Result]] = defaultdict(list)
    for r in new:
        by[keys.finding(r)].append(r)
    return tuple(ReportedFinding(**_fields(max(reversed(rs), key=lambda r: (bool(r.repro), r.time))), lines=len(rs))
                 for rs in by.values())


def _fields(r: Result) -> dict:
    """A result line's fields as its constructor takes them (its build a Build still)."""
    return {f.name: getattr(r, f.name) for f in fields(r)}


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


def check_key(check: str) -> tuple[int, str]:
    """A check's place in the report: its declared order (harness.checks), any other check after them."""
    return (CHECK_ORDER.index(check) if check in CHECK_ORDER else len(CHECK_ORDER), check)
