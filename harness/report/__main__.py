"""Fold every session's results into a report read like a conformance dashboard: what broke, what changed since the
last report, and where.

`python -m harness.report results [--out DIR] [--since OLD/report.json ...] [--run ID ...] [--subject NAME ...]` reads
results/<release>/results.jsonl (only the lines of the runs and subjects named, with --run and --subject) and writes,
into the results folder unless --out: report.md (the CI summary, harness.report.markdown), report.html (the same report
as one self-contained page with a drill-down per cell and filters, harness.report.html) and report.json (every count,
and the keys a later report compares against, harness.report.fold). First a verdict (one per subject where the lines are
of several; naming the runs it was folded from, when there are several) and the runs folded, each with its lines per
release (partial: other runs' lines are among them), then what changed since the last OLD (harness.report.changes) when
anything did, the last build that passed per subject and release, the new findings grouped by kind with their REPRO
lines, the failures only one release, backend or cache dtype has (harness.report.lone_failures), then per subject a
release x check and a release x cache dtype matrix whose cells read passed/total (harness.report.cells), each release
naming the vLLM build its lines came from and each release x check cell its history over the OLD reports and the history
they kept (harness.report.history: a chart per cell in the HTML, the last change in the markdown); every outcome word
with its count comes after, under Details. Outcome words are never folded together, and an outcome a known finding
predicted is marked `[known]` (see docs/report.md). The performance lane's lines (results/<release>/performance.jsonl,
harness.results.timings: all of them, whatever --run names; each release's file holds the last bench of each subject)
are shown beside the conformance cells and in a section of their own; they never change the verdict, and a folder of
them alone is a report whose verdict says there are no conformance results. Where the folder holds `nox -s
connectors`' results (connectors/), the connector compatibility table (harness.report.connectors) ends report.md and
report.html.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.report import connectors
from harness.report.fold import report_data, runs
from harness.report.html import report_html
from harness.report.markdown import report_md
from harness.results import read
from harness.results.timings import FILE as TIMINGS
from harness.results.timings import read as read_timings
from harness.results.words import count


def main(argv: list[str]) -> int:
    """Write report.md, report.html and report.json; the exit status (1: neither result nor performance lines, 2: a
    result or performance line, report, recording or --run it cannot read)."""
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--since", type=Path, action="append", default=[], metavar="OLD/report.json",
                        help="an earlier report.json (repeatable, oldest first): what changed since the last comes "
                             "first, and each cell shows its history over them")
    parser.add_argument("--run", action="append", default=[], metavar="ID",
                        help="fold only this run's lines (repeatable); the Runs section names the others")
    parser.add_argument("--subject", action="append", default=[], metavar="NAME",
                        help="fold only this subject's lines (repeatable); several subjects get a verdict each")
    args = parser.parse_args(argv)
    try:
        rows, timings, tables = read(args.results), read_timings(args.results), connectors.tables(args.results)
        if not rows and not timings and not tables:  # any alone is a report; its verdict says NO CONFORMANCE RESULTS
            print(f"no results under {args.results} (expected <release>/results.jsonl, <release>/{TIMINGS} or "
                  f"{connectors.FOLDER}/<connector>/<release>/results.jsonl)", file=sys.stderr)
            return 1
        known = [r.run for r in runs(rows)]
        if unknown := [x for x in args.run if x not in known]:
            raise ValueError(f"--run {', '.join(unknown)}: no such run under {args.results}; its runs: "
                             + ", ".join(known))
        subjects = sorted({r.subject for r in rows})
        if unknown := [x for x in args.subject if x not in subjects]:
            raise ValueError(f"--subject {', '.join(unknown)}: no lines of it under {args.results}; its subjects: "
                             + ", ".join(subjects))
        if args.subject:
            rows = [r for r in rows if r.subject in args.subject]
            timings = [t for t in timings if t.subject in args.subject]
        chosen = set(args.run or known)
        data = report_data([r for r in rows if r.run in chosen], args.since, [r for r in rows if r.run not in chosen],
                           timings=timings)
    except ValueError as e:  # a result or performance line, report or recording it cannot read (named), or a --run
        print(f"python -m harness.report: {e}", file=sys.stderr)
        return 2
    out = args.out or args.results
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data.as_json(), indent=1) + "\n")
    shown = f"\n## Connectors: connector release × vLLM release × model\n\n{connectors.markdown(tables)}" if tables \
        else ""
    (out / "report.md").write_text(report_md(data) + shown)
    page = report_html(data)
    (out / "report.html").write_text(page.replace("</body>", connectors.section_html(tables) + "</body>") if tables
                                     else page)
    print(f"{out / 'report.md'}, report.html: {data.verdict}; {sum(r.lines for r in data.runs)} results, "
          f"{count(len(timings), 'performance line')}, {count(len(data.releases), 'release')}, "
          f"{count(len(tables), 'connector release')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
