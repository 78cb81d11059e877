"""The report as markdown (report.md, the CI summary): no colour, so red cells and marks are bold."""

from __future__ import annotations

from harness.report import cells, fold, history, sections
from harness.report.cells import MARKS, Mark
from harness.report.schema import Report


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


def _md_change(data: Report, subject: str, release: str, check: str) -> str:
    """A cell's last change over the earlier reports, in brackets after it ("" when it has none)."""
    said = history.last_change(data, subject, release, check)
    return f" ({said})" if said else ""


def _md_bench_cell(b: sections.Bench | None) -> str:
    """A paged / dense cell as markdown: the worst ratio and its mark (bold with a new performance finding), the
    marks of the other words beside it."""
    if b is None:
        return "·"
    return " ".join([f"**{b.face}**" if b.red else b.face, *(_md_mark(m, n) for m, n in b.beside)])


def md_bench(data: Report, subject: str, release: str) -> str:
    """A subject's paged / dense cell of one release as markdown (`·`: not benched)."""
    return _md_bench_cell(sections.bench_cell(data, subject, release))


def _md_bench(data: Report) -> list[str]:
    """The Performance section: per subject its rows, the new findings first; then the stale known ones."""
    if not data.performance:
        return []
    lines = ["", f"## {sections.BENCH_TITLE}", "", sections.BENCH_NOTE]
    for subject in data.performance:
        lines += ["", f"### {subject}", "", "| " + " | ".join(sections.BENCH_HEAD) + " |",
                  "|---" * len(sections.BENCH_HEAD) + "|"]
        lines += ["| " + " | ".join([*row.texts[:3], _md_bench_cell(row.cell), *row.texts[4:]]) + " |"
                  for row in sections.bench_rows(data, subject)]
    lines += ["", f"### {sections.BENCH_STALE}", ""]
    return lines + ([f"- {x}" for x in sections.bench_stale(data)] or ["none"])


def _md_group(data: Report, g: sections.Group) -> list[str]:
    lines = [f"- **{cells.mark(g.outcome).glyph} {g.word}** · {sections.headline(data, g)}  ",
             f"  {g.diagnosis}"]
    if g.repros:
        lines += ["", "  ```", *(f"  {r}" for r in g.repros[:sections.REPROS_SHOWN]), "  ```"]
    if len(g.repros) > sections.REPROS_SHOWN:
        lines.append(f"  +{len(g.repros) - sections.REPROS_SHOWN:,} more REPRO lines (report.json `new_findings`)")
    return lines


def _md_section(s: sections.Section, level: str = "###") -> list[str]:
    lines = ["", f"{level} {'**' + s.title + '**' if s.red else s.title}", ""]
    for item in s.items:
        lines.append(f"- {item.text}")
        if item.repro:
            lines += ["", "  ```", f"  {item.repro}", "  ```"]
    if s.more:
        lines.append(f"- +{s.more:,} more (report.json)")
    return lines


def _md_dtypes(data: Report, subject: str) -> list[str]:
    columns = sections.dtype_columns(data, subject)
    if not columns:
        return []
    out = ["", f"#### {subject}: release × cache dtype", "", "| release | " + " | ".join(columns) + " |",
           "|---|" + "---|" * len(columns)]
    for release in data.releases:
        ds = data.cache_dtypes[subject].get(release, {})
        out.append(f"| {release} | " + " | ".join(md_cell(ds.get(d, {})) for d in columns) + " |")
    return out


def _summary(data: Report, subject: str) -> str:
    """A subject's totals: `passed/total passed` and every other mark with its count (only benched: says so)."""
    c = cells.cell(sections.totals(data, subject))
    if c is None:
        return sections.UNCHECKED
    return f"{c.passed:,}/{c.total:,} passed — " + " · ".join(f"{_md_mark(m, n)} {m.name}" for m, n in c.others)


def report_md(data: Report) -> str:
    """report.md: the verdict, the runs, what changed, what broke, where, the performance lane's findings, and every
    word under Details."""
    releases, kinds = data.releases, sections.groups(data)
    lines = ["# kvconform conformance report", "", f"**{data.verdict}**", ""]
    if said := sections.bench_verdict(data):
        lines += [said, ""]
    lines += [f"- {subject}: {_summary(data, subject)}" for subject in sections.subjects(data)]
    lines += ["", f"## Runs folded ({len(data.runs)})", "", "| " + " | ".join(sections.RUNS_HEAD) + " |",
              "|---" * len(sections.RUNS_HEAD) + "|",
              *("| " + " | ".join(row) + " |" for row in sections.runs_table(data))]
    lines += ["", sections.RUNS_NOTE] if any(r.partial for r in data.runs) else []
    if data.left_out:
        lines += ["", "Not folded (no `--run` names them): "
                  + ", ".join(fold.run_text(data, r) for r in data.left_out)]
    if changed := sections.change_sections(data):
        lines += ["", f"## Since {data.changes.since} ({data.changes.since_verdict})"]
        for s in changed:
            lines += _md_section(s)
    elif data.changes is not None:
        lines += ["", f"Since {data.changes.since}: no changes."]
    if kinds:
        lines += ["", "## What broke (new findings, worst first)", ""]
        for g in kinds[:sections.FIRST_GROUPS]:
            lines += _md_group(data, g)
        if len(kinds) > sections.FIRST_GROUPS:
            lines.append(f"- +{len(kinds) - sections.FIRST_GROUPS} more kinds of new finding: under Details")
    for s in sections.lone_failure_sections(data):
        lines += _md_section(s, "##")
    if pins := sections.pins(data):
        lines += ["", f"## {sections.PINS_TITLE}", "", *(f"- {p}" for p in pins)]
    lines += ["", "## Where: release × check", "", sections.LEGEND + " " + " · ".join(
        f"{_md_mark(m)} {m.name} ({m.meaning})" for m in MARKS) + "."]
    lines += ["", sections.BENCH_LEGEND] if data.performance else []
    for subject in sections.subjects(data):
        cols, bench = sections.columns(data, subject), sections.benched(data, subject)
        lines += ["", f"### {subject}", "", "| " + " | ".join(
                      ["release", "contracts from", *cols, *([sections.BENCH_COLUMN] if bench else [])]) + " |",
                  "|---|---|" + "---|" * (len(cols) + bench)]
        for release in releases:
            cs = data.checks.get(subject, {}).get(release, {})
            lines.append(f"| {release} | {sections.source(data, subject, release)} | "
                         + " | ".join([*(md_cell(cs.get(check, {})) + _md_change(data, subject, release, check)
                                         for check in cols),
                                       *([md_bench(data, subject, release)] if bench else [])]) + " |")
        lines += _md_dtypes(data, subject)
    lines += _md_bench(data)
    if data.api_changes:
        lines += ["", f"## {sections.API_TITLE}", "", sections.API_NOTE, ""]
        lines += [f"- **{a.release}** (against {a.before}): "
                  + " · ".join(f"{k}: {t}" for k, t in a.said.items()) for a in data.api_changes]
    lines += ["", "## Known findings (green, reported)", ""]
    lines += [f"- {i}: {c} {o} on {rs}, x{n:,}" for i, c, o, rs, n in sections.known(data)] or ["none"]
    lines += ["", f"## {sections.STALE_TITLE}", ""]
    lines += [f"- {i}: {c} on {rs}" for i, c, rs in sections.stale(data)] or ["none"]
    lines += ["", f"## {sections.UNEXERCISED_TITLE}", ""]
    lines += [f"- {i}: {c} on {rs}: {d}" for i, c, rs, d in sections.unexercised(data)] or ["none"]
    lines += ["", "## Unsupported (the subject's reasons)", ""]
    lines += [f"- {u.subject}: {u.reason} x{u.count:,}" for u in data.unsupported] or ["none"]
    lines += ["", "## Backends (as the folded result lines name them)", ""]
    lines += [f"- {b}" for b in sections.backend_lines(data)] or ["none recorded"]
    lines += ["", "## Details"]
    if len(kinds) > sections.FIRST_GROUPS:
        lines += ["", "### More new findings", ""]
        for g in kinds[sections.FIRST_GROUPS:]:
            lines += _md_group(data, g)
    for subject in sorted(data.checks):
        cols = sections.columns(data, subject)
        lines += ["", f"### {subject}: every outcome word per release and check", "",
                  "| release | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for release in releases:
            cs = data.checks[subject].get(release, {})
            lines.append(f"| {release} | " + " | ".join(sections.words(check, cs[check]) if check in cs else "·"
                                                        for check in cols) + " |")
        by_release = data.matrix[subject]
        geometries = [g for g in data.geometries if any(g in gs for gs in by_release.values())]
        lines += ["", f"### {subject}: release × geometry", "",
                  "| release | " + " | ".join(sections.label(g).replace(":", "<br>") for g in geometries) + " |",
                  "|---|" + "---|" * len(geometries)]
        for release in releases:
            gs = by_release.get(release, {})
            lines.append(f"| {release} | " + " | ".join(md_cell(gs.get(g, {})) for g in geometries) + " |")
    return "\n".join(lines) + "\n"
