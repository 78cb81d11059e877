"""The report as one self-contained HTML page (inline CSS and script, no other file, works offline): the markdown
report's content, each cell coloured by its passed fraction (red with a new finding), and a drill-down: a click on a
cell opens its rows under the matrix (geometry x backends x cache dtype, every word with its count, REPRO lines),
which the filters (subject, release, check, backend, cache dtype, outcome word) narrow too. The filters live in the
address's fragment (`report.html#subject=builtin&release=0.33.0&check=bit-identity&at=m0`), so that a view can be
linked; without a script every row is listed, unfiltered, under the matrices.

The page is well-formed XML as well as HTML (every tag closed, the script in a CDATA section), so that a test can
read it with an XML parser.
"""

from __future__ import annotations

from html import escape

from harness.report import cells, fold, history, sections
from harness.report.cells import MARKS, Mark
from harness.report.schema import Report

_TONES = "".join(  # f0..f10: the passed fraction in tenths, pale to full green
    f".f{i}{{background:hsl(122,{30 + 3 * i}%,{93 - 4 * i}%)}}" for i in range(11))

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:16px 24px;color:#222}
h1{font-size:18px;margin:0 0 8px}h2{font-size:16px;margin:20px 0 6px}h3{font-size:14px;margin:16px 0 6px}
.verdict{font-size:24px;font-weight:700;padding:8px 14px;border-radius:4px;color:#fff;display:inline-block;margin:0}
.verdict.red{background:#c62828}.verdict.green{background:#2e7d32}.verdict.none{background:#616161}
.totals{margin:6px 0}.legend{color:#555;font-size:12px}
.finding{border-left:5px solid #c62828;padding:2px 10px;margin:6px 0;background:#fff5f5}
.finding p{margin:2px 0}.diag{color:#444}
.changes{border:2px solid #555;padding:4px 12px;margin:10px 0;background:#fafafa}
svg.spark{display:block;margin-top:2px}svg.spark polyline{fill:none;stroke:#555;stroke-width:1}
svg.spark circle{fill:#2e7d32}svg.spark circle.red{fill:#c62828}svg.spark circle.absent{fill:#bbb}
.changes h3.red,h2.red{color:#c62828}
pre{font:11px/1.35 ui-monospace,"DejaVu Sans Mono",monospace;background:#f6f6f6;padding:3px 6px;margin:3px 0;
 white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:1px 6px;text-align:center}
table.geo{font-size:10px}table.geo td,table.geo th{padding:1px 2px}
th{background:#fafafa;font-weight:600}td.rel{text-align:left;font-weight:600;white-space:nowrap}
td.src{color:#777;font-size:11px}td.none{color:#bbb}td.words{font-size:11px;text-align:left}
td.cell{white-space:nowrap;min-width:60px}td.cell b{font-weight:700}td.cell .m{font-size:11px}
td.c{cursor:pointer}td.c.dim{opacity:.25}td.c:hover{outline:2px solid #333}
.m{font-weight:600;white-space:nowrap;border-radius:3px;padding:0 3px}
.error{background:#b71c1c;color:#fff}.fails{background:#e53935;color:#fff}.known{background:#b2dfdb;color:#004d40}
.unsupported{background:#d7d7d7;color:#333}.not-run{background:#e4e4e4;color:#444}
.skipped{background:#f0f0f0;color:#777}.not-applicable{background:#fff;color:#999}
.stale{background:#ffe082;color:#5d4000}.unexercised{background:#ffcc80;color:#5d2c00}
.pass{background:#c8e6c9;color:#1b5e20}
.not-timed{background:#e53935;color:#fff}.bench-verdict{color:#c62828;font-weight:600;margin:6px 0}
td.red{background:#e53935;color:#fff}td.red .m{border:1px solid #fff}
.filters{position:sticky;top:0;background:#fff;padding:6px 0;border-bottom:1px solid #ddd;z-index:1}
.filters label{margin-right:10px;font-size:12px}
#drill{border:2px solid #333;padding:4px 10px;margin:8px 0;background:#fcfcfc}
#rows{font-size:12px}#rows td{text-align:left}#rows pre{margin:1px 0}
""" + _TONES

# Kept free of "<" and "&" anyway: the page must stay readable as XML, and a CDATA section keeps it so regardless.
_SCRIPT = """
(function () {
  var F = ["subject", "release", "check", "backend", "dtype", "outcome"];
  var rows = Array.prototype.slice.call(document.querySelectorAll("#rows tr[data-subject]"));
  var cells = Array.prototype.slice.call(document.querySelectorAll("td.c"));
  var drill = document.getElementById("drill"), home = document.getElementById("drill-home");
  function sel(f) { return document.getElementById("f-" + f); }
  function has(tr, f, v) {
    if (f === "backend") return tr.dataset.backends.split(" ").indexOf(v) !== -1;
    if (f === "outcome") return tr.dataset.outcomes.split("|").indexOf(v) !== -1;
    return tr.dataset[f] === v;
  }
  function key(el, col) { return el.dataset.subject + "|" + el.dataset.release + "|" + col; }
  function apply() {
    var p = new URLSearchParams(location.hash.slice(1)), want = [], hit = {}, shown = 0;
    F.forEach(function (f) { var v = p.get(f) || ""; sel(f).value = v; if (v) want.push([f, v]); });
    rows.forEach(function (tr) {
      var ok = want.every(function (fv) { return has(tr, fv[0], fv[1]); });
      tr.hidden = !ok;
      if (ok) { shown += 1; hit[key(tr, tr.dataset.check)] = 1; hit[key(tr, "@" + tr.dataset.dtype)] = 1; }
    });
    cells.forEach(function (td) {
      var k = key(td, td.dataset.check ? td.dataset.check : "@" + td.dataset.dtype);
      td.classList.toggle("dim", want.length !== 0 && !hit[k]);
    });
    document.querySelectorAll("section.subject").forEach(function (s) {
      s.hidden = Boolean(p.get("subject")) && s.dataset.subject !== p.get("subject");
    });
    var at = p.get("at") ? document.getElementById(p.get("at")) : null;
    (at || home).after(drill);
    document.getElementById("showing").textContent = want.length ?
      shown + " of " + rows.length + " rows: " + want.map(function (fv) { return fv[0] + " " + fv[1]; }).join(", ") :
      "all " + rows.length + " rows: pick a cell or a filter";
  }
  function go(p) { location.hash = p.toString(); }
  F.forEach(function (f) {
    sel(f).addEventListener("change", function () {
      var p = new URLSearchParams(location.hash.slice(1));
      if (this.value) { p.set(f, this.value); } else { p.delete(f); }
      p.delete("at");
      go(p);
    });
  });
  cells.forEach(function (td) {
    td.addEventListener("click", function () {
      var p = new URLSearchParams();
      p.set("subject", td.dataset.subject);
      p.set("release", td.dataset.release);
      if (td.dataset.check) { p.set("check", td.dataset.check); } else { p.set("dtype", td.dataset.dtype); }
      p.set("at", td.closest("table").id);
      go(p);
    });
  });
  document.getElementById("f-clear").addEventListener("click", function () { go(new URLSearchParams()); });
  window.addEventListener("hashchange", apply);
  apply();
})();
"""


def _h(text: str) -> str:
    return escape(text)


def _html_mark(m: Mark, n: int) -> str:
    return f'<span class="m {m.name}">{m.glyph}{n:,}</span>'


def _cell(counts: dict[str, int], check: str, where: dict[str, str], spark: str = "") -> str:
    """A matrix cell: its face and the marks beside it, coloured by its tone, and `spark` (its history) under them;
    `where` its data attributes (subject, release, check or dtype) that a click filters the rows by."""
    c = cells.cell(counts)
    if c is None:
        return f'<td class="none">·{spark}</td>'
    attrs = "".join(f' data-{k}="{_h(v)}"' for k, v in where.items())
    kind = "cell c" if where else "cell"  # c: it opens rows
    return (f'<td class="{kind} {c.tone}"{attrs} title="{_h(sections.words(check, counts))}"><b>{_h(c.face)}</b>'
            + "".join(" " + _html_mark(m, n) for m, n in c.beside) + spark + "</td>")


SPARK_W, SPARK_H = 64, 16


def _spark(series: list[tuple[str, list | None]]) -> str:
    """A cell's history as a small chart: passed / total per report, oldest first (a red dot: a new finding then;
    grey at the bottom: no such cell then); every point's date and counts in its title. Empty without history."""
    if len(series) < 2:
        return ""
    step = (SPARK_W - 4) / (len(series) - 1)

    def y(c: list | None) -> float:
        return SPARK_H - 2 if c is None else 2 + (SPARK_H - 4) * (1 - c[0] / c[1])

    points = [(2 + i * step, y(c), c) for i, (_, c) in enumerate(series)]
    lines, run = [], []
    for x, yy, c in points + [(0, 0, None)]:  # a report without the cell breaks the line
        if c is None:
            if len(run) > 1:
                lines.append(" ".join(run))
            run = []
        else:
            run.append(f"{x:.1f},{yy:.1f}")
    title = "; ".join(f"{(when[:10] or '?')}: " + ("absent" if c is None else f"{c[0]:,}/{c[1]:,}" + " red" * c[2])
                      for when, c in series)
    return (f'<svg class="spark" width="{SPARK_W}" height="{SPARK_H}" viewBox="0 0 {SPARK_W} {SPARK_H}">'
            f"<title>{_h(title)}</title>" + "".join(f'<polyline points="{p}"/>' for p in lines)
            + "".join(f'<circle cx="{x:.1f}" cy="{yy:.1f}" r="1.8"'
                      + (' class="absent"' if c is None else ' class="red"' if c[2] else "") + "/>"
                      for x, yy, c in points) + "</svg>")


def _bench_cell(b: sections.Bench | None) -> str:
    """A paged / dense cell: the worst ratio and its mark, the other marks beside it, red with a new performance
    finding; every word in its hover title. Not clickable: its lines are no drill-down row."""
    if b is None:
        return '<td class="none">·</td>'
    return (f'<td class="cell bench {b.tone}" title="{_h(b.words)}"><b>{_h(b.face)}</b>'
            + "".join(" " + _html_mark(m, n) for m, n in b.beside) + "</td>")


def _bench_section(data: Report) -> str:
    """The Performance section, as the markdown's: per subject its rows, the new findings first; then the stale
    known ones."""
    if not data.performance:
        return ""
    out = [f'<h2>{_h(sections.BENCH_TITLE)}</h2><p class="legend">{_h(sections.BENCH_NOTE)}</p>']
    for n, subject in enumerate(data.performance):
        out.append(f'<h3>{_h(subject)}</h3><table id="p{n}"><tr>'
                   + "".join(f"<th>{_h(h)}</th>" for h in sections.BENCH_HEAD) + "</tr>")
        out += ["<tr>" + "".join(f'<td class="words">{_h(t)}</td>' for t in row.texts[:3]) + _bench_cell(row.cell)
                + "".join(f'<td class="words">{_h(t)}</td>' for t in row.texts[4:]) + "</tr>"
                for row in sections.bench_rows(data, subject)]
        out.append("</table>")
    out.append(f"<h3>{_h(sections.BENCH_STALE)}</h3><ul>"
               + ("".join(f"<li>{_h(x)}</li>" for x in sections.bench_stale(data)) or "<li>none</li>") + "</ul>")
    return "".join(out)


def _group(data: Report, g: sections.Group) -> str:
    m = cells.mark(g.outcome)
    more = (f"<p>+{len(g.repros) - sections.REPROS_SHOWN:,} more REPRO lines (report.json <code>new_findings</code>)"
            "</p>" if len(g.repros) > sections.REPROS_SHOWN else "")
    return (f'<div class="finding"><p><span class="m {m.name}">{m.glyph} {_h(g.word)}</span> '
            f'{_h(sections.headline(data, g))}</p><p class="diag">{_h(g.diagnosis)}</p>'
            + "".join(f"<pre>{_h(r)}</pre>" for r in g.repros[:sections.REPROS_SHOWN]) + more + "</div>")


def _section(s: sections.Section, tag: str = "h3") -> str:
    items = "".join(f"<li>{_h(i.text)}" + (f"<pre>{_h(i.repro)}</pre>" if i.repro else "") + "</li>"
                    for i in s.items)
    more = f"<li>+{s.more:,} more (report.json)</li>" if s.more else ""
    red = ' class="red"' if s.red else ""
    return f"<{tag}{red}>{_h(s.title)}</{tag}><ul>{items}{more}</ul>"


def _select(name: str, label: str, values: list[str]) -> str:
    return (f'<label>{_h(label)} <select id="f-{name}"><option value="">any</option>'
            + "".join(f'<option value="{_h(v)}">{_h(v)}</option>' for v in values) + "</select></label>")


def _filters(data: Report) -> str:
    rows = data.rows
    outcomes = sorted({w for r in rows for w in r.counts}, key=cells.rank)
    return ('<div class="filters">'
            + _select("subject", "subject", sorted({r.subject for r in rows}))
            + _select("release", "release", data.releases)
            + _select("check", "check", sorted({r.check for r in rows}, key=fold.check_key))
            + _select("backend", "backend", list(data.backends))
            + _select("dtype", "cache dtype", sorted({r.cache_dtype for r in rows if r.cache_dtype},
                                                    key=lambda d: (d != "auto", d)))
            + _select("outcome", "outcome", outcomes)
            + '<button type="button" id="f-clear">clear</button></div>')


def _runs(data: Report) -> str:
    """The runs folded, as the markdown's Runs section."""
    out = [f"<h2>Runs folded ({len(data.runs)})</h2><table id=\"runs\"><tr>"
           + "".join(f"<th>{_h(h)}</th>" for h in sections.RUNS_HEAD) + "</tr>"]
    out += ["<tr>" + "".join(f'<td class="words">{_h(c)}</td>' for c in row) + "</tr>"
            for row in sections.runs_table(data)]
    out.append("</table>")
    if any(r.partial for r in data.runs):
        out.append(f'<p class="legend">{_h(sections.RUNS_NOTE)}</p>')
    if data.left_out:
        out.append("<p>Not folded (no <code>--run</code> names them): "
                   + _h(", ".join(fold.run_text(data, r) for r in data.left_out)) + "</p>")
    return "".join(out)


def _rows(data: Report) -> str:
    """Every drill-down row: geometry x backends x cache dtype of a subject's release and check."""
    out = ['<div id="drill-home"></div><div id="drill"><h2>Rows</h2><p id="showing">every row</p><table id="rows">'
           "<tr><th>subject</th><th>release</th><th>check</th><th>geometry</th><th>backends</th><th>cache dtype</th>"
           "<th>words</th><th>REPRO</th></tr>"]
    for r in data.rows:
        c = cells.cell(r.counts)
        out.append(
            f'<tr data-subject="{_h(r.subject)}" data-release="{_h(r.release)}" data-check="{_h(r.check)}"'
            f' data-backends="{_h(" ".join(r.backends))}" data-dtype="{_h(r.cache_dtype)}"'
            f' data-outcomes="{_h("|".join(r.counts))}">'
            f"<td>{_h(r.subject)}</td><td>{_h(r.release)}</td><td>{_h(r.check)}</td>"
            f"<td>{_h(sections.label(r.geometry))}</td><td>{_h(', '.join(r.backends))}</td>"
            f"<td>{_h(r.cache_dtype)}</td>"
            f'<td class="w {c.tone}">{_h(sections.words(r.check, r.counts))}</td>'
            f"<td>{''.join(f'<pre>{_h(x)}</pre>' for x in r.repros)}</td></tr>")
    out.append("</table></div>")
    return "\n".join(out)


def report_html(data: Report) -> str:
    """The report as one self-contained HTML page: the markdown report's content with a drill-down per cell and
    filters."""
    releases, kinds = data.releases, sections.groups(data)
    tone = "red" if data.new_findings else "green" if data.runs else "none"  # none: no result line, not green
    out = [f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/><title>kvconform: {_h(data.verdict)}'
           f"</title><style>{_CSS}</style></head><body>", "<h1>kvconform conformance report</h1>",
           f'<p class="verdict {tone}">{_h(data.verdict)}</p>']
    if said := sections.bench_verdict(data):
        out.append(f'<p class="bench-verdict">{_h(said)}</p>')
    for subject in sections.subjects(data):
        c = cells.cell(sections.totals(data, subject))
        out.append(f'<p class="totals">{_h(subject)}: ' + (_h(sections.UNCHECKED) if c is None else (
            f"<b>{c.passed:,}/{c.total:,} passed</b> — "
            + " ".join(f"{_html_mark(m, n)} {m.name}" for m, n in c.others))) + "</p>")
    out.append(_runs(data))
    if changed := sections.change_sections(data):
        ch = data.changes
        out.append(f'<div class="changes"><h2>Since {_h(ch.since)} ({_h(ch.since_verdict)})</h2>'
                   + "".join(_section(s) for s in changed) + "</div>")
    elif data.changes is not None:
        out.append(f"<p>Since {_h(data.changes.since)}: no changes.</p>")
    if kinds:
        out.append("<h2>What broke (new findings, worst first)</h2>")
        out += [_group(data, g) for g in kinds[:sections.FIRST_GROUPS]]
        if len(kinds) > sections.FIRST_GROUPS:
            out.append(f"<p>+{len(kinds) - sections.FIRST_GROUPS} more kinds of new finding: under Details</p>")
    out += [_section(s, "h2") for s in sections.lone_failure_sections(data)]
    if pins := sections.pins(data):
        out.append(f'<h2>{_h(sections.PINS_TITLE)}</h2><ul id="pins">'
                   + "".join(f"<li>{_h(p)}</li>" for p in pins) + "</ul>")
    out.append(f'<h2>Where: release × check</h2><p class="legend">{_h(sections.LEGEND)} Click a cell for its rows. '
               + " ".join(f'<span class="m {m.name}">{m.glyph}</span>&#160;{m.name} ({_h(m.meaning)})'
                          for m in MARKS) + "</p>")
    if data.performance:
        out.append(f'<p class="legend">{_h(sections.BENCH_LEGEND)}</p>')
    out.append(_filters(data))
    for n, subject in enumerate(sections.subjects(data)):
        columns, bench = sections.columns(data, subject), sections.benched(data, subject)
        out.append(f'<section class="subject" data-subject="{_h(subject)}"><h3>{_h(subject)}</h3>'
                   f'<table id="m{n}"><tr><th>release</th><th>contracts from</th>'
                   + "".join(f"<th>{_h(c)}</th>" for c in columns)
                   + (f"<th>{_h(sections.BENCH_COLUMN)}</th>" if bench else "") + "</tr>")
        for release in releases:
            cs = data.checks.get(subject, {}).get(release, {})
            tds = [_cell(cs.get(check, {}), check, {"subject": subject, "release": release, "check": check},
                         _spark(history.series(data, subject, release, check))) for check in columns]
            tds += [_bench_cell(sections.bench_cell(data, subject, release))] if bench else []
            out.append(f'<tr><td class="rel">{_h(release)}</td><td class="src">'
                       f"{_h(sections.source(data, subject, release))}</td>" + "".join(tds) + "</tr>")
        out.append("</table>")
        if columns := sections.dtype_columns(data, subject):
            out.append(f'<h3>{_h(subject)}: release × cache dtype</h3><table id="d{n}"><tr><th>release</th>'
                       + "".join(f"<th>{_h(d)}</th>" for d in columns) + "</tr>")
            for release in releases:
                ds = data.cache_dtypes[subject].get(release, {})
                out.append(f'<tr><td class="rel">{_h(release)}</td>' + "".join(
                    _cell(ds.get(d, {}), "", {"subject": subject, "release": release, "dtype": d}) for d in columns)
                    + "</tr>")
            out.append("</table>")
        out.append("</section>")
    out += [_rows(data), _bench_section(data)]
    if data.api_changes:
        out.append(f'<h2>{_h(sections.API_TITLE)}</h2><p class="legend">{_h(sections.API_NOTE)}</p><ul id="api">'
                   + "".join(f"<li><b>{_h(a.release)}</b> (against {_h(a.before)}): "
                             + " · ".join(f"{_h(k)}: {_h(t)}" for k, t in a.said.items()) + "</li>"
                             for a in data.api_changes) + "</ul>")
    out.append("<h2>Known findings (green, reported)</h2><ul>" + ("".join(
        f"<li>{_h(i)}: {_h(c)} {_h(o)} on {_h(rs)}, x{n:,}</li>" for i, c, o, rs, n in sections.known(data))
        or "<li>none</li>") + "</ul>")
    out.append(f"<h2>{_h(sections.STALE_TITLE)}</h2><ul>" + ("".join(
        f"<li>{_h(i)}: {_h(c)} on {_h(rs)}</li>" for i, c, rs in sections.stale(data)) or "<li>none</li>") + "</ul>")
    out.append(f'<h2>{_h(sections.UNEXERCISED_TITLE)}</h2><ul id="unexercised">' + ("".join(
        f"<li>{_h(i)}: {_h(c)} on {_h(rs)}: {_h(d)}</li>" for i, c, rs, d in sections.unexercised(data))
        or "<li>none</li>") + "</ul>")
    out.append("<h2>Unsupported (the subject's reasons)</h2><ul>" + ("".join(
        f"<li>{_h(u.subject)}: {_h(u.reason)} x{u.count:,}</li>" for u in data.unsupported)
        or "<li>none</li>") + "</ul>")
    out.append("<h2>Backends (as the folded result lines name them)</h2><ul>" + (
        "".join(f"<li>{_h(b)}</li>" for b in sections.backend_lines(data)) or "<li>none recorded</li>") + "</ul>")
    out.append("<h2>Details</h2>")
    if len(kinds) > sections.FIRST_GROUPS:
        out.append("<h3>More new findings</h3>")
        out += [_group(data, g) for g in kinds[sections.FIRST_GROUPS:]]
    for subject in sorted(data.checks):
        columns = sections.columns(data, subject)
        out.append(f"<h3>{_h(subject)}: every outcome word per release and check</h3><table><tr><th>release</th>"
                   + "".join(f"<th>{_h(c)}</th>" for c in columns) + "</tr>")
        for release in releases:
            cs = data.checks[subject].get(release, {})
            out.append(f'<tr><td class="rel">{_h(release)}</td>' + "".join(
                f'<td class="words">{_h(sections.words(c, cs[c]))}</td>' if c in cs else '<td class="none">·</td>'
                for c in columns) + "</tr>")
        out.append("</table>")
        out.append(_geometries(data, subject))
    out.append(f"<script>//<![CDATA[{_SCRIPT}//]]></script>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _geometries(data: Report, subject: str) -> str:
    """The release x geometry matrix of a subject: a family heads its physical orders; a pseudo geometry (dense, *)
    heads its own column. The geometries are sorted by family, so each family's columns are contiguous."""
    by_release = data.matrix[subject]
    geometries = [g for g in data.geometries if any(g in gs for gs in by_release.values())]
    families: dict[str, int] = {}
    for g in geometries:
        families[sections.family(data, g)] = families.get(sections.family(data, g), 0) + 1
    out = [f'<h3>{_h(subject)}: release × geometry</h3><table class="geo"><tr><th rowspan="2">release</th>'
           + "".join(f'<th colspan="{n}">{_h(f)}</th>' if f not in geometries
                     else f'<th rowspan="2">{_h(sections.label(f))}</th>' for f, n in families.items()) + "</tr><tr>"
           # <wbr/>: an order's name may break at its dots, so that 19 columns fit a screen
           + "".join(f"<th>{_h(data.orders[g]).replace('.', '.<wbr/>')}</th>" for g in geometries
                     if g in data.families) + "</tr>"]
    for release in data.releases:
        gs = by_release.get(release, {})
        out.append(f'<tr><td class="rel">{_h(release)}</td>' + "".join(
            _cell(gs[g], "", {}) if g in gs else '<td class="none">·</td>' for g in geometries) + "</tr>")
    out.append("</table>")
    return "".join(out)
