"""The report as typed values: what harness.report.fold builds, the pages and the workflow read, and report.json holds.

report.json is `Report.as_json()`, field for field; `read` takes one back, every field checked against its type here, so
that a report.json of another shape is refused naming the file and the field, never read as a wrong answer. Tables
keyed by what the report found (subject, release, check, geometry, cache dtype) stay mappings; everything with named
fields is a frozen dataclass. Word counts (`Counts`) are ordered worst word first (harness.report.cells.rank).
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path

from harness.matrix.build import Build
from harness.recordings.api_history import ApiChange
from harness.report.keys import DrillRow
from harness.report.lone_failures import LoneFailure
from harness.results import Result
from harness.results.timings import Timing

REPORT_SCHEMA = 1  # of report.json; a report of another schema is refused by `read`

Counts = dict[str, int]  # outcome word -> result lines, the worst word first
Table = dict[str, dict[str, dict[str, Counts]]]  # subject -> release -> column (geometry, check, cache dtype) -> counts


@dataclass(frozen=True)
class Run:
    """One run among the lines: its subjects, sources, when its first and last lines were written, its lines per
    release, its checks; folded, `of` (the lines of its subjects in its releases) and `partial` (other runs' lines
    are among them)."""

    run: str
    subjects: tuple[str, ...]
    sources: tuple[str, ...]
    first: str
    last: str
    lines: int
    releases: dict[str, int]
    checks: tuple[str, ...]
    of: int = 0  # 0 for a run not folded
    partial: bool = False


@dataclass(frozen=True)
class RunLines:
    """One run's lines of a subject in a release, and when the last of them was written ("unknown" when none says)."""

    run: str
    time: str
    lines: int


@dataclass(frozen=True)
class Provenance:
    """Where a subject's lines of one release come from: their sources, the vLLM builds, each run."""

    sources: tuple[str, ...]
    builds: tuple[Build, ...]
    runs: tuple[RunLines, ...]


@dataclass(frozen=True)
class Seen:
    """Where the folded lines name a backend: its releases and geometries, in the report's order."""

    releases: tuple[str, ...]
    geometries: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ReportedFinding(Result):
    """A new finding (harness.report.keys.finding): its newest line with a REPRO line (else its newest), and how many
    result lines it folds."""

    lines: int


@dataclass(frozen=True)
class KnownCount:
    """A known finding's lines of one release, geometry, check and outcome."""

    id: str
    release: str
    geometry: str
    check: str
    outcome: str
    count: int


@dataclass(frozen=True)
class Unsupported:
    """A subject's reason for unsupported cases, with how many lines give it."""

    subject: str
    reason: str
    count: int


@dataclass(frozen=True)
class ApiRelease:
    """A release's layout API changes against the recorded release before it, and what each kind of name says."""

    release: str
    before: str
    said: dict[str, str]
    changes: tuple[ApiChange, ...]


@dataclass(frozen=True)
class Worst:
    """A performance line as a cell shows it: its ratio, where, how it ended and against what limit."""

    ratio: float
    geometry: str
    workload: str
    tile: str
    outcome: str
    known: str
    band: float
    limit: float
    roofline: str
    diagnosis: str


@dataclass(frozen=True)
class BenchedRow:
    """One workload and tile of a release's performance lines: word counts, new findings, its worst cell (the timed
    one with the largest ratio, else its worst line)."""

    workload: str
    tile: str
    counts: Counts
    new_findings: int
    worst: Worst


@dataclass(frozen=True)
class Benched:
    """One subject's performance lines of one release: word counts, its worst timed cell (None: nothing timed), a
    row per workload and tile in the order the lane wrote them, its new and stale performance findings, and where
    its contracts came from."""

    counts: Counts
    worst: Worst | None
    rows: tuple[BenchedRow, ...]
    new_findings: tuple[Timing, ...]
    stale_findings: tuple[Timing, ...]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Change:
    """One key (its backends grouped: those that changed alike) that went from one class to another."""

    subject: str
    release: str
    check: str
    geometry: str
    cache_dtype: str
    backends: tuple[str, ...]
    before: str  # an outcome class, or "absent"
    after: str
    repro: str = ""  # the first REPRO line of its lines now, if any


@dataclass(frozen=True)
class Presence:
    """A geometry or backend that one of the two reports has in a release and the other does not."""

    subject: str
    release: str
    name: str


@dataclass(frozen=True)
class Changes:
    """Everything that changed since the previous report, each list sorted."""

    since: str  # the previous report's path as given
    since_verdict: str
    new_failures: tuple[Change, ...]
    fixes: tuple[Change, ...]
    subjects_appeared: tuple[str, ...]
    subjects_vanished: tuple[str, ...]
    releases_appeared: tuple[str, ...]
    releases_vanished: tuple[str, ...]
    geometries_appeared: tuple[Presence, ...]
    geometries_vanished: tuple[Presence, ...]
    backends_appeared: tuple[Presence, ...]
    backends_vanished: tuple[Presence, ...]
    gone_stale: tuple[Presence, ...]  # name: "<known id> (<check>)"
    gone_unexercised: tuple[Presence, ...]  # as gone_stale


Face = tuple[int, int, bool]  # a release x check cell as history keeps it: passed, total, red


@dataclass(frozen=True)
class Point:
    """An earlier report as a point of history: when its newest line was written, its runs, verdict and cells."""

    report: str
    when: str
    runs: tuple[str, ...]
    verdict: str
    cells: dict[str, dict[str, dict[str, Face]]]


@dataclass(frozen=True)
class Passed:
    """The build whose lines last passed in a subject's release, its pin, and the run and time of those lines."""

    build: Build
    pin: str
    run: str
    when: str


@dataclass(frozen=True)
class Report:
    """Everything a report says (harness.report.fold.report_data): the fields of report.json, in its order."""

    schema: int
    releases: tuple[str, ...]
    runs: tuple[Run, ...]
    left_out: tuple[Run, ...]  # the runs not folded (--run names others)
    origins: dict[str, dict[str, Provenance]]
    geometries: tuple[str, ...]
    families: dict[str, str]  # geometry -> its family as a column head (`packed@fp8_e4m3`)
    orders: dict[str, str]  # geometry -> its physical axis order
    matrix: Table  # release x geometry
    checks: Table  # release x check
    cache_dtypes: Table  # release x cache dtype
    backends: dict[str, Seen]
    rows: tuple[DrillRow, ...]
    new_findings: tuple[ReportedFinding, ...]
    known_findings: tuple[KnownCount, ...]
    stale_findings: tuple[Result, ...]
    unexercised_findings: tuple[Result, ...]
    unsupported: tuple[Unsupported, ...]
    keys: tuple[tuple[str, ...], ...]  # [*Key, class], harness.report.keys.encoded
    specific: tuple[LoneFailure, ...]
    unchecked: dict[str, dict[str, str]]  # subject -> release with lines where nothing of it was checked -> why
    api_changes: tuple[ApiRelease, ...]
    performance: dict[str, dict[str, Benched]]
    verdict: str
    history: tuple[Point, ...] = ()
    last_passed: dict[str, dict[str, Passed]] = field(default_factory=dict)
    changes: Changes | None = None  # since the last earlier report given

    def as_json(self) -> dict:
        """The report as report.json holds it."""
        return json.loads(json.dumps(asdict(self)))


def read(path: Path) -> Report:
    """A report.json (written by `python -m harness.report`) as a Report; a ValueError naming the file, and the field
    where it is not one of this kvconform's."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{path}: not a report.json (not JSON: {e})") from None
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        found = data.get("schema", "none") if isinstance(data, dict) else "none"
        raise ValueError(f"{path}: not a report.json of report schema {REPORT_SCHEMA} (found schema {found}): pass "
                         "the report.json a `python -m harness.report` of this kvconform wrote")
    try:
        return _value(Report, data, "report.json")
    except _Misread as e:
        raise ValueError(f"{path}: not a report.json of this kvconform: {e}") from None


class _Misread(Exception):
    """A field of report.json whose value is not of its type (the message names the field)."""


def _value(tp, value, where: str):
    """`value` (from JSON) as type `tp`, each nested field checked; a _Misread naming `where`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
        return _value(tp, value, where)
    if is_dataclass(tp):
        if not isinstance(value, dict):
            raise _Misread(f"{where}: expected an object of {tp.__name__}, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        known = {f.name: f for f in fields(tp) if f.init}
        if unknown := sorted(set(value) - set(known)):
            raise _Misread(f"{where}: unknown fields {unknown} (a {tp.__name__} has {list(known)})")
        if missing := [n for n, f in known.items()
                       if n not in value and f.default is MISSING and f.default_factory is MISSING]:
            raise _Misread(f"{where}: missing fields {missing} of a {tp.__name__}")
        try:
            return tp(**{n: _value(hints[n], v, f"{where}.{n}") for n, v in value.items()})
        except (TypeError, ValueError) as e:
            raise _Misread(f"{where}: not a {tp.__name__}: {e}") from None
    if origin is tuple:
        if not isinstance(value, list):
            raise _Misread(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise _Misread(f"{where}: expected {len(args)} values, got {len(value)}")
        return tuple(_value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise _Misread(f"{where}: expected an object, got {type(value).__name__}")
        return {k: _value(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise _Misread(f"{where}: {value!r} is no {tp.__name__}") from None
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise _Misread(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value
