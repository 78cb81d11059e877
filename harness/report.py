"""Fold every session's results into a release x geometry matrix, in markdown and JSON.

`python -m harness.report results [--out DIR]` reads results/<release>/results.jsonl and writes report.md and
report.json (into the results folder unless --out). A cell lists each outcome word with its count, the worst first;
outcome words are never folded together, and an outcome a known finding predicted is marked `[known]`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from harness.results import PASSING, STALE, Result, read

# Worst first: what a reader must see before anything else in a cell.
SEVERITY = ("harness-error", "install-error", "contract-error", "subject-error", "differs", "accepted",
            "unsupported", "not-run", "skipped", STALE, "bit-identical", "within-tolerance", "rejected")


def _release_key(release: str):
    from harness.matrix import version_key

    return version_key(release)


def _word(r: Result) -> str:
    return f"{r.outcome} [known]" if r.known and r.outcome != STALE else r.outcome


def _rank(word: str) -> tuple[int, str]:
    base = word.removesuffix(" [known]")
    # A known finding is green: rank it just ahead of the passes, behind every new finding and error.
    return (SEVERITY.index("unsupported") if word.endswith("[known]") else SEVERITY.index(base), word)


def fold(rows: list[Result]) -> dict:
    """The report as data: per subject a release x geometry matrix of outcome counts, and the lists to act on."""
    matrix: dict[str, dict[str, dict[str, Counter]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(Counter)))
    checks: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    sources: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        matrix[r.subject][r.release][r.geometry][_word(r)] += 1
        checks[r.release][r.check][_word(r)] += 1
        sources[r.release].add(r.source)
    new = [r for r in rows
           if r.outcome not in PASSING + ("unsupported", "skipped", "not-run", STALE) and not r.known]
    known = Counter((r.known, r.release, r.geometry, r.check, r.outcome)
                    for r in rows if r.known and r.outcome != STALE)
    unsupported = Counter((r.subject, r.diagnosis) for r in rows if r.outcome == "unsupported")
    releases = sorted({r.release for r in rows}, key=_release_key)
    return {
        "releases": releases,
        "sources": {k: sorted(v) for k, v in sources.items()},
        "geometries": sorted({r.geometry for r in rows}, key=lambda g: (g in ("dense", "*"), g)),
        "matrix": {s: {rel: {g: dict(sorted(c.items(), key=lambda kv: _rank(kv[0]))) for g, c in gs.items()}
                       for rel, gs in by_rel.items()} for s, by_rel in matrix.items()},
        "checks": {rel: {c: dict(v) for c, v in cs.items()} for rel, cs in checks.items()},
        "new_findings": [r.__dict__ for r in new],
        "known_findings": [dict(zip(("id", "release", "geometry", "check", "outcome"), k), count=n)
                           for k, n in sorted(known.items())],
        "stale_findings": [r.__dict__ for r in rows if r.outcome == STALE],
        "unsupported": [{"subject": s, "reason": d, "count": n} for (s, d), n in unsupported.most_common()],
    }


def markdown(data: dict) -> str:
    lines = ["# kvconform conformance report", ""]
    red = len(data["new_findings"])
    lines.append(f"**{'RED' if red else 'GREEN'}**: {red} new finding(s), {len(data['known_findings'])} known, "
                 f"{len(data['stale_findings'])} stale; releases {len(data['releases'])}, "
                 f"contracts from: " + ", ".join(f"{r} {'/'.join(data['sources'][r])}" for r in data["releases"]))
    geometries = data["geometries"]
    for subject, by_release in sorted(data["matrix"].items()):
        lines += ["", f"## {subject}: release x geometry", "",
                  "| release | " + " | ".join(f"`{g}`" for g in geometries) + " |",
                  "|---|" + "---|" * len(geometries)]
        for release in data["releases"]:
            cells = by_release.get(release, {})
            row = [" · ".join(f"{'**' + w + '**' if _rank(w)[0] < SEVERITY.index('unsupported') else w} {n}"
                              for w, n in cells.get(g, {}).items()) or "—" for g in geometries]
            lines.append(f"| {release} | " + " | ".join(row) + " |")
    lines += ["", "## New findings (make the run red)", ""]
    lines += [f"- {r['release']} `{r['geometry']}` {r['subject']} {r['check']} ({r['sparsity']}): **{r['outcome']}**"
              f" {r['diagnosis']}" + (f"  \n  `{r['repro']}`" if r["repro"] else "") for r in data["new_findings"]]
    lines += ["" if data["new_findings"] else "none", "", "## Known findings (green, reported)", ""]
    lines += [f"- {k['id']}: {k['release']} `{k['geometry']}` {k['check']} {k['outcome']} x{k['count']}"
              for k in data["known_findings"]] or ["none"]
    lines += ["", "## Stale known findings (applied, did not happen: remove or narrow them)", ""]
    lines += [f"- {r['known']} on {r['release']}: {r['diagnosis']}" for r in data["stale_findings"]] or ["none"]
    lines += ["", "## Unsupported (the subject's reasons)", ""]
    lines += [f"- {u['subject']}: {u['reason']} x{u['count']}" for u in data["unsupported"]] or ["none"]
    lines += ["", "## Examples per check", "", "| release | check | outcomes |", "|---|---|---|"]
    for release in data["releases"]:
        for check, counts in sorted(data["checks"].get(release, {}).items()):
            lines.append(f"| {release} | {check} | " + " · ".join(f"{w} {n}" for w, n in
                                                                   sorted(counts.items(), key=lambda kv: _rank(kv[0])))
                         + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = read(args.results)
    if not rows:
        print(f"no results under {args.results} (expected <release>/results.jsonl)", file=sys.stderr)
        return 1
    out = args.out or args.results
    out.mkdir(parents=True, exist_ok=True)
    data = fold(rows)
    (out / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "report.md").write_text(markdown(data))
    print(f"{out / 'report.md'}: {len(rows)} results, {len(data['releases'])} releases, "
          f"{len(data['new_findings'])} new findings")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
