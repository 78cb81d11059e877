"""Fold every session's results into a report whose first screen says what broke, and where.

`python -m harness.report results [--out DIR]` reads results/<release>/results.jsonl and writes, into the results
folder unless --out: report.md (the CI summary), report.html (the same report as one self-contained page, a colour
per outcome) and report.json (every count). First a verdict, then the new findings grouped by kind with their REPRO
lines, then a release x check matrix with one mark per cell (the cell's worst outcome) and how many results have it;
every outcome word with its count comes after, under Details. Outcome words are never folded together, and an
outcome a known finding predicted is marked `[known]` (see docs/report.md).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import checks
from harness.results import PASSING, STALE, Result, read

# Worst first: what a reader must see before anything else in a cell.
SEVERITY = ("harness-error", "install-error", "contract-error", "subject-error", "timeout", "differs", "accepted",
            "unsupported", "not-run", "skipped", "not-applicable", STALE, "bit-identical", "within-tolerance",
            "rejected")

# Checks in their declared order (harness.checks): could a release be installed and read, the layout, the kernels.
CHECK_ORDER = tuple(c.name for c in checks.CHECKS)

LEGEND = ("A cell shows its worst outcome's mark and how many results have that mark (every word and count: "
          "Details); · nothing recorded.")
FIRST_GROUPS = 6  # kinds of new finding on the first screen; the rest under Details
REPROS_SHOWN = 2  # REPRO lines per kind; all of them are in report.json's new_findings


@dataclass(frozen=True)
class Mark:
    """What a matrix cell shows for a class of outcome words: a glyph, and (HTML) a colour."""

    glyph: str
    name: str  # also its colour class in the HTML
    meaning: str
    red: bool = False


ERROR = Mark("!", "error", "harness, install, contract or subject error, or an item past its time limit", red=True)
FAIL = Mark("✗", "fails", "differs, drift, or a malformed cache accepted", red=True)
KNOWN = Mark("◆", "known", "as a known finding predicted")
UNSUPPORTED = Mark("⊘", "unsupported", "the subject says it cannot run the case")
NOT_RUN = Mark("–", "not-run", "the split reads other elements")
SKIPPED = Mark("○", "skipped", "could not run here")
NOT_APPLICABLE = Mark("∅", "not-applicable", "the subject does not declare what the check needs")
STALE_MARK = Mark("◌", "stale", "a known finding did not happen")
PASS = Mark("✓", "pass", "bit-identical, no drift, agrees, within tolerance, rejected as documented")
MARKS = (ERROR, FAIL, KNOWN, UNSUPPORTED, NOT_RUN, SKIPPED, NOT_APPLICABLE, STALE_MARK, PASS)
_MARK_OF = {**dict.fromkeys(SEVERITY[:5], ERROR), "differs": FAIL, "accepted": FAIL, "unsupported": UNSUPPORTED,
            "not-run": NOT_RUN, "skipped": SKIPPED, "not-applicable": NOT_APPLICABLE, STALE: STALE_MARK,
            **dict.fromkeys(PASSING, PASS)}


def _release_key(release: str):
    from harness.matrix import version_key

    return version_key(release)


def _word(r: Result) -> str:
    return f"{r.outcome.value} [known]" if r.known and r.outcome != STALE else r.outcome.value


def _rank(word: str) -> tuple[int, str]:
    base = word.removesuffix(" [known]")
    # A known finding is green: rank it just ahead of the passes, behind every new finding and error.
    return (SEVERITY.index("unsupported") if word.endswith("[known]") else SEVERITY.index(base), word)


def mark(word: str) -> Mark:
    return KNOWN if word.endswith(" [known]") else _MARK_OF[word]


def says(check: str, word: str) -> str:
    """The word a reader sees for `word` recorded by `check` ("no drift" for the drift check's bit-identical). Displayed
    only: results and report.json keep the stored word, so that one word still means one thing across checks."""
    base = word.removesuffix(" [known]")
    return checks.says(check, base) + word[len(base):]


def marks(counts: dict[str, int]) -> list[tuple[Mark, int]]:
    """Every mark of a cell with how many results have it, the worst (by SEVERITY) first."""
    n: Counter = Counter()
    for word, k in sorted(counts.items(), key=lambda kv: _rank(kv[0])):
        n[mark(word)] += k  # insertion order is the order of each mark's worst word
    return list(n.items())


def cell(counts: dict[str, int]) -> tuple[Mark, int] | None:
    """The one mark a matrix cell shows: its worst outcome's, with how many results have that mark."""
    return marks(counts)[0] if counts else None


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
        checks = sorted({r["check"] for r in rs}, key=_check_key)
        firsts = {r["check"]: r["repro"] for r in reversed(rs) if r["repro"]}
        repros = dict.fromkeys([firsts[c] for c in checks if c in firsts] + [r["repro"] for r in rs if r["repro"]])
        out.append(Group(subject, outcome, rs[0]["diagnosis"], tuple(checks),
                         tuple(r for r in data["releases"] if r in {x["release"] for x in rs}),
                         tuple(g for g in data["geometries"] if g in {x["geometry"] for x in rs}), tuple(repros),
                         len(rs)))
    return sorted(out, key=lambda g: (_rank(g.outcome), -g.count, g.subject, g.checks))


def verdict(data: dict) -> str:
    """RED with how many new findings in how many releases, or GREEN: known and stale findings never make it red."""
    new = data["new_findings"]
    where = {r["release"] for r in new}
    if not new:
        return f"GREEN: no new findings in {_n(len(data['releases']), 'release')}"
    return f"RED: {_n(len(new), 'new finding')} in {_n(len(where), 'release')}"


def fold(rows: list[Result]) -> dict:
    """The report as data: per subject a release x geometry and a release x check matrix of outcome counts, and the
    lists to act on."""
    matrix: dict[str, dict[str, dict[str, Counter]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(Counter)))
    by_check: dict[str, dict[str, dict[str, Counter]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(Counter)))
    sources: dict[str, set[str]] = defaultdict(set)
    runs: dict[str, dict[str, str]] = defaultdict(dict)  # release -> run id -> when its last line was written
    dtypes: dict[str, dict[str, dict[str, Counter]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(Counter)))
    family: dict[str, str] = {}  # geometry -> its family as a column head (with its cache dtype), read off the lines
    backends: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # geometry -> backend -> releases
    for r in rows:
        matrix[r.subject][r.release][r.geometry][_word(r)] += 1
        by_check[r.subject][r.release][r.check][_word(r)] += 1
        if r.family:
            dtypes[r.subject][r.release][r.cache_dtype][_word(r)] += 1
            family[r.geometry] = r.family + ("" if r.cache_dtype == "auto" else f"@{r.cache_dtype}")
            for b in r.backends:
                backends[r.geometry][b].add(r.release)
        sources[r.release].add(r.source)
        runs[r.release][r.run] = max(runs[r.release].get(r.run, ""), r.time)
    new = [r for r in rows
           if r.outcome not in PASSING + ("unsupported", "skipped", "not-run", "not-applicable", STALE)
           and not r.known]
    known = Counter((r.known, r.release, r.geometry, r.check, r.outcome)
                    for r in rows if r.known and r.outcome != STALE)
    unsupported = Counter((r.subject, r.diagnosis) for r in rows if r.outcome == "unsupported")
    releases = sorted({r.release for r in rows}, key=_release_key)
    first: dict[str, int] = {}  # a family's or geometry's first release: read in the order vLLM introduced them
    for r in rows:
        for key in {family.get(r.geometry, r.geometry), r.geometry}:
            first[key] = min(first.get(key, len(releases)), releases.index(r.release))

    def ordered(table: dict[str, dict[str, dict[str, Counter]]]) -> dict:
        return {s: {rel: {k: dict(sorted(c.items(), key=lambda kv: _rank(kv[0]))) for k, c in ks.items()}
                    for rel, ks in by_rel.items()} for s, by_rel in table.items()}

    data = {
        "releases": releases,
        "sources": {k: sorted(v) for k, v in sources.items()},
        "runs": {k: [{"run": run or "unknown", "time": t or "unknown"} for run, t in sorted(v.items())]
                 for k, v in runs.items()},
        "geometries": sorted({r.geometry for r in rows},
                             key=lambda g: (g not in family, first[family.get(g, g)], first[g], g)),
        "families": family,
        "orders": {r.geometry: r.order for r in rows if r.order},
        "matrix": ordered(matrix),
        "checks": ordered(by_check),
        "cache_dtypes": ordered(dtypes),
        "backends": {g: [f"{b} ({span(rs, releases)})" for b, rs in sorted(by.items())]
                     for g, by in backends.items()},
        "new_findings": [_plain(r) for r in new],
        "known_findings": [dict(zip(("id", "release", "geometry", "check", "outcome"), k), count=n)
                           for k, n in sorted(known.items())],
        "stale_findings": [_plain(r) for r in rows if r.outcome == STALE],
        "unsupported": [{"subject": s, "reason": d, "count": n} for (s, d), n in unsupported.most_common()],
    }
    data["verdict"] = verdict(data)
    return data


def _plain(r: Result) -> dict:
    return {**asdict(r), "outcome": r.outcome.value}


def _family(data: dict, geometry: str) -> str:
    """The family a geometry's lines name (`packed@fp8_e4m3`); a pseudo geometry (`dense`, `*`) is its own."""
    return data["families"].get(geometry, geometry)


def _label(geometry: str) -> str:
    return "whole release" if geometry == "*" else geometry


def _n(n: int, noun: str) -> str:
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


def _where(data: dict, geometries: tuple[str, ...]) -> str:
    if len(geometries) <= 3:
        return ", ".join(_label(g) for g in geometries)
    families = Counter(_family(data, g) for g in geometries)
    return f"{len(geometries)} geometries (" + ", ".join(f"{f} {n}" for f, n in families.items()) + ")"


def _check_key(check: str) -> tuple[int, str]:
    return (CHECK_ORDER.index(check) if check in CHECK_ORDER else len(CHECK_ORDER), check)


def _columns(data: dict, subject: str) -> list[str]:
    return sorted({c for cs in data["checks"][subject].values() for c in cs}, key=_check_key)


def _source(data: dict, release: str) -> str:
    """How the release's contracts were read, and which run its lines come from (and when it ran)."""
    runs = ", ".join(f"run {r['run']} at {r['time']}" for r in data["runs"][release])
    return f"{'/'.join(data['sources'][release])}, {runs}"


def _totals(data: dict, subject: str) -> dict[str, int]:
    total: Counter = Counter()
    for cs in data["checks"][subject].values():
        for counts in cs.values():
            total.update(counts)
    return dict(total)


def _headline(data: dict, g: Group) -> str:
    return (f"{g.subject} · {', '.join(g.checks)} · {span(g.releases, data['releases'])} · "
            f"{_where(data, g.geometries)} · {_n(g.count, 'result')}")


def _stale(data: dict) -> list[tuple[str, str, str]]:
    """Stale findings as (id, check, releases), one line per known finding and check."""
    by: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in data["stale_findings"]:
        by[(r["known"], r["check"])].append(r["release"])
    return [(k, c, span(rs, data["releases"])) for (k, c), rs in sorted(by.items())]


def _known(data: dict) -> list[tuple[str, str, str, str, int]]:
    """Known findings as (id, check, outcome, releases, count), one line per known finding, check and outcome."""
    by: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for k in data["known_findings"]:
        by[(k["id"], k["check"], k["outcome"])].append(k)
    return [(i, c, says(c, o), span({k["release"] for k in ks}, data["releases"]), sum(k["count"] for k in ks))
            for (i, c, o), ks in sorted(by.items())]


# ---------------------------------------------------------------------------------------------------- markdown


def _md_mark(m: Mark, n: int | None = None) -> str:
    text = m.glyph + ("" if n is None else f"{n:,}")
    return f"**{text}**" if m.red else text  # no colour in markdown: red marks are bold


def _md_group(data: dict, g: Group) -> list[str]:
    lines = [f"- **{mark(g.outcome).glyph} {g.word}** · {_headline(data, g)}  ",
             f"  {g.diagnosis}"]
    if g.repros:
        lines += ["", "  ```", *(f"  {r}" for r in g.repros[:REPROS_SHOWN]), "  ```"]
    if len(g.repros) > REPROS_SHOWN:
        lines.append(f"  +{len(g.repros) - REPROS_SHOWN:,} more REPRO lines (report.json `new_findings`)")
    return lines


def _dtype_columns(data: dict, subject: str) -> list[str]:
    seen = {d for ds in data["cache_dtypes"].get(subject, {}).values() for d in ds}
    return sorted(seen, key=lambda d: (d != "auto", d)) if len(seen) > 1 else []


def _md_dtypes(data: dict, subject: str) -> list[str]:
    columns = _dtype_columns(data, subject)
    if not columns:
        return []
    out = ["", f"#### {subject}: release × cache dtype", "", "| release | " + " | ".join(columns) + " |",
           "|---|" + "---|" * len(columns)]
    for release in data["releases"]:
        ds = data["cache_dtypes"][subject].get(release, {})
        out.append(f"| {release} | " + " | ".join(_md_mark(*c) if (c := cell(ds.get(d, {}))) else "·"
                                                 for d in columns) + " |")
    return out


def markdown(data: dict) -> str:
    releases, kinds = data["releases"], groups(data)
    lines = ["# kvconform conformance report", "", f"**{data['verdict']}**", ""]
    for subject in sorted(data["checks"]):
        lines.append(f"- {subject}: {_n(sum(_totals(data, subject).values()), 'result')} — "
                     + " · ".join(f"{_md_mark(m, n)} {m.name}" for m, n in marks(_totals(data, subject))))
    if kinds:
        lines += ["", "## What broke (new findings, worst first)", ""]
        for g in kinds[:FIRST_GROUPS]:
            lines += _md_group(data, g)
        if len(kinds) > FIRST_GROUPS:
            lines.append(f"- +{len(kinds) - FIRST_GROUPS} more kinds of new finding: under Details")
    lines += ["", "## Where: release × check", "", LEGEND + " " + " · ".join(
        f"{_md_mark(m)} {m.name} ({m.meaning})" for m in MARKS) + "."]
    for subject in sorted(data["checks"]):
        columns = _columns(data, subject)
        lines += ["", f"### {subject}", "", "| release | contracts from | " + " | ".join(columns)
                  + " |", "|---|---|" + "---|" * len(columns)]
        for release in releases:
            cs = data["checks"][subject].get(release, {})
            row = [_md_mark(*c) if (c := cell(cs.get(check, {}))) else "·" for check in columns]
            lines.append(f"| {release} | {_source(data, release)} | " + " | ".join(row) + " |")
        lines += _md_dtypes(data, subject)
    lines += ["", "## Known findings (green, reported)", ""]
    lines += [f"- {i}: {c} {o} on {rs}, x{n:,}" for i, c, o, rs, n in _known(data)] or ["none"]
    lines += ["", "## Stale known findings (applied, did not happen: remove or narrow them)", ""]
    lines += [f"- {i}: {c} on {rs}" for i, c, rs in _stale(data)] or ["none"]
    lines += ["", "## Unsupported (the subject's reasons)", ""]
    lines += [f"- {u['subject']}: {u['reason']} x{u['count']:,}" for u in data["unsupported"]] or ["none"]
    lines += ["", "## Which backends hand each geometry (from the recordings)", ""]
    lines += [f"- {g}: {', '.join(bs)}" for g, bs in data["backends"].items()] or ["none recorded"]
    lines += ["", "## Details"]
    if len(kinds) > FIRST_GROUPS:
        lines += ["", "### More new findings", ""]
        for g in kinds[FIRST_GROUPS:]:
            lines += _md_group(data, g)
    for subject in sorted(data["checks"]):
        columns = _columns(data, subject)
        lines += ["", f"### {subject}: every outcome word per release and check", "",
                  "| release | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for release in releases:
            cs = data["checks"][subject].get(release, {})
            lines.append(f"| {release} | " + " | ".join(
                " · ".join(f"{says(check, w)} {n:,}" for w, n in cs.get(check, {}).items()) or "·"
                for check in columns) + " |")
        by_release = data["matrix"][subject]
        geometries = [g for g in data["geometries"] if any(g in gs for gs in by_release.values())]
        lines += ["", f"### {subject}: release × geometry (every mark with its count)", "",
                  "| release | " + " | ".join(_label(g).replace(":", "<br>") for g in geometries) + " |",
                  "|---|" + "---|" * len(geometries)]
        for release in releases:
            gs = by_release.get(release, {})
            lines.append(f"| {release} | " + " | ".join(" ".join(_md_mark(m, n) for m, n in marks(gs[g]))
                                                        if g in gs else "·" for g in geometries) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- HTML

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:16px 24px;color:#222}
h1{font-size:18px;margin:0 0 8px}h2{font-size:16px;margin:20px 0 6px}h3{font-size:14px;margin:16px 0 6px}
.verdict{font-size:24px;font-weight:700;padding:8px 14px;border-radius:4px;color:#fff;display:inline-block;margin:0}
.verdict.red{background:#c62828}.verdict.green{background:#2e7d32}
.totals{margin:6px 0}.legend{color:#555;font-size:12px}
.finding{border-left:5px solid #c62828;padding:2px 10px;margin:6px 0;background:#fff5f5}
.finding p{margin:2px 0}.diag{color:#444}
pre{font:11px/1.35 ui-monospace,"DejaVu Sans Mono",monospace;background:#f6f6f6;padding:3px 6px;margin:3px 0;
 white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:1px 6px;text-align:center}
table.geo{font-size:10px}table.geo td,table.geo th{padding:1px 2px}
th{background:#fafafa;font-weight:600}td.rel{text-align:left;font-weight:600;white-space:nowrap}
td.src{color:#777;font-size:11px}td.none{color:#bbb}td.words{font-size:11px;text-align:left}
.m{font-weight:600;white-space:nowrap;border-radius:3px;padding:0 3px}
td.m{border-radius:0;min-width:52px}
.error{background:#b71c1c;color:#fff}.fails{background:#e53935;color:#fff}.known{background:#b2dfdb;color:#004d40}
.unsupported{background:#d7d7d7;color:#333}.not-run{background:#e4e4e4;color:#444}
.skipped{background:#f0f0f0;color:#777}.not-applicable{background:#fff;color:#999}
.stale{background:#ffe082;color:#5d4000}.pass{background:#c8e6c9;color:#1b5e20}
"""


def _h(text: str) -> str:
    return html.escape(text)


def _html_mark(m: Mark, n: int, tag: str = "span", title: str = "") -> str:
    t = f' title="{_h(title)}"' if title else ""
    return f'<{tag} class="m {m.name}"{t}>{m.glyph}{n:,}</{tag}>'


def _html_group(data: dict, g: Group) -> str:
    m = mark(g.outcome)
    more = (f"<p>+{len(g.repros) - REPROS_SHOWN:,} more REPRO lines (report.json <code>new_findings</code>)</p>"
            if len(g.repros) > REPROS_SHOWN else "")
    return (f'<div class="finding"><p><span class="m {m.name}">{m.glyph} {_h(g.word)}</span> '
            f'{_h(_headline(data, g))}</p><p class="diag">{_h(g.diagnosis)}</p>'
            + "".join(f"<pre>{_h(r)}</pre>" for r in g.repros[:REPROS_SHOWN]) + more + "</div>")


def _words(check: str, counts: dict[str, int]) -> str:
    return " · ".join(f"{says(check, w)} {n:,}" for w, n in counts.items())


def html_page(data: dict) -> str:
    """The markdown report's content as one self-contained HTML page (inline CSS, no script): same verdict, findings,
    matrices and details, each mark coloured by its outcome; a matrix cell's title lists every word and count."""
    releases, kinds = data["releases"], groups(data)
    red = bool(data["new_findings"])
    out = [f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/><title>kvconform: {_h(data["verdict"])}'
           f"</title><style>{_CSS}</style></head><body>", "<h1>kvconform conformance report</h1>",
           f'<p class="verdict {"red" if red else "green"}">{_h(data["verdict"])}</p>']
    for subject in sorted(data["checks"]):
        out.append(f'<p class="totals">{_h(subject)}: {_n(sum(_totals(data, subject).values()), "result")} — '
                   + " ".join(f"{_html_mark(m, n)} {m.name}" for m, n in marks(_totals(data, subject))) + "</p>")
    if kinds:
        out.append("<h2>What broke (new findings, worst first)</h2>")
        out += [_html_group(data, g) for g in kinds[:FIRST_GROUPS]]
        if len(kinds) > FIRST_GROUPS:
            out.append(f"<p>+{len(kinds) - FIRST_GROUPS} more kinds of new finding: under Details</p>")
    out.append(f'<h2>Where: release × check</h2><p class="legend">{_h(LEGEND)} ' + " ".join(
        f'<span class="m {m.name}">{m.glyph}</span>&#160;{m.name} ({_h(m.meaning)})' for m in MARKS) + "</p>")
    for subject in sorted(data["checks"]):
        columns = _columns(data, subject)
        out.append(f"<h3>{_h(subject)}</h3><table><tr><th>release</th><th>contracts from</th>"
                   + "".join(f"<th>{_h(c)}</th>" for c in columns) + "</tr>")
        for release in releases:
            cs = data["checks"][subject].get(release, {})
            tds = [_html_mark(*c, tag="td", title=_words(check, cs[check])) if (c := cell(cs.get(check, {})))
                   else '<td class="none">·</td>' for check in columns]
            out.append(f'<tr><td class="rel">{_h(release)}</td><td class="src">{_h(_source(data, release))}</td>'
                       + "".join(tds) + "</tr>")
        out.append("</table>")
        if columns := _dtype_columns(data, subject):
            out.append(f"<h3>{_h(subject)}: release × cache dtype</h3><table><tr><th>release</th>"
                       + "".join(f"<th>{_h(d)}</th>" for d in columns) + "</tr>")
            for release in releases:
                ds = data["cache_dtypes"][subject].get(release, {})
                out.append(f'<tr><td class="rel">{_h(release)}</td>' + "".join(
                    _html_mark(*c, tag="td", title=_words("", ds[d])) if (c := cell(ds.get(d, {})))
                    else '<td class="none">·</td>' for d in columns) + "</tr>")
            out.append("</table>")
    out.append("<h2>Known findings (green, reported)</h2><ul>" + ("".join(
        f"<li>{_h(i)}: {_h(c)} {_h(o)} on {_h(rs)}, x{n:,}</li>" for i, c, o, rs, n in _known(data)) or "<li>none</li>")
        + "</ul>")
    out.append("<h2>Stale known findings (applied, did not happen: remove or narrow them)</h2><ul>" + ("".join(
        f"<li>{_h(i)}: {_h(c)} on {_h(rs)}</li>" for i, c, rs in _stale(data)) or "<li>none</li>") + "</ul>")
    out.append("<h2>Unsupported (the subject's reasons)</h2><ul>" + ("".join(
        f"<li>{_h(u['subject'])}: {_h(u['reason'])} x{u['count']:,}</li>" for u in data["unsupported"])
        or "<li>none</li>") + "</ul>")
    out.append("<h2>Which backends hand each geometry (from the recordings)</h2><ul>" + ("".join(
        f"<li>{_h(g)}: {_h(', '.join(bs))}</li>" for g, bs in data["backends"].items()) or "<li>none recorded</li>")
        + "</ul>")
    out.append("<h2>Details</h2>")
    if len(kinds) > FIRST_GROUPS:
        out.append("<h3>More new findings</h3>")
        out += [_html_group(data, g) for g in kinds[FIRST_GROUPS:]]
    for subject in sorted(data["checks"]):
        columns = _columns(data, subject)
        out.append(f"<h3>{_h(subject)}: every outcome word per release and check</h3><table><tr><th>release</th>"
                   + "".join(f"<th>{_h(c)}</th>" for c in columns) + "</tr>")
        for release in releases:
            cs = data["checks"][subject].get(release, {})
            out.append(f'<tr><td class="rel">{_h(release)}</td>' + "".join(
                f'<td class="words">{_h(_words(c, cs[c]))}</td>' if c in cs else '<td class="none">·</td>'
                for c in columns) + "</tr>")
        out.append("</table>")
        by_release = data["matrix"][subject]
        geometries = [g for g in data["geometries"] if any(g in gs for gs in by_release.values())]
        # A family heads its physical orders; a pseudo geometry (dense, *) heads its own column. The geometries are
        # sorted by family, so each family's columns are contiguous.
        families = Counter(_family(data, g) for g in geometries)
        out.append(f"<h3>{_h(subject)}: release × geometry (every mark with its count)</h3><table class=\"geo\">"
                   '<tr><th rowspan="2">release</th>' + "".join(
                       f'<th colspan="{n}">{_h(f)}</th>' if f not in geometries
                       else f'<th rowspan="2">{_h(_label(f))}</th>' for f, n in families.items()) + "</tr><tr>"
                   # <wbr/>: an order's name may break at its dots, so that 19 columns fit a screen
                   + "".join(f"<th>{_h(data['orders'][g]).replace('.', '.<wbr/>')}</th>" for g in geometries
                             if g in data["families"])
                   + "</tr>")
        for release in releases:
            gs = by_release.get(release, {})
            out.append(f'<tr><td class="rel">{_h(release)}</td>' + "".join(
                f'<td title="{_h(_words("", gs[g]))}">' + " ".join(_html_mark(m, n) for m, n in marks(gs[g]))
                + "</td>" if g in gs else '<td class="none">·</td>' for g in geometries) + "</tr>")
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


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
    (out / "report.html").write_text(html_page(data))
    print(f"{out / 'report.md'}, report.html: {data['verdict']}; {len(rows)} results, "
          f"{len(data['releases'])} releases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
