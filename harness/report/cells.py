"""What a report cell says about the result lines in it: passed / total, coloured by that fraction, with every other
word counted beside it under its mark; and the outcome class of a word (pass, known, fail, error, not run), the unit
that runs are compared in; and the mark of a performance line's word (harness.results.timings), which the report shows
beside the conformance cells but never counts among them.

A cell's words are the stored outcome words, a known finding's with ` [known]` after it; they are never folded into
one another: marks group words only for their glyph, the counts stay per word.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from harness import checks
from harness.results import NOT_RAN, PASSING, STALE, UNEXERCISED, timings

# Worst first: what a reader must see before anything else in a cell.
SEVERITY = ("harness-error", "install-error", "contract-error", "subject-error", "timeout", "differs", "accepted",
            "unsupported", "not-run", "skipped", "not-applicable", UNEXERCISED, STALE, "bit-identical",
            "within-tolerance", "rejected")
ERRORS = SEVERITY[:5]
FAILURES = ("differs", "accepted")

# Outcome classes, worst first: a set of lines has the class of its worst line (a key whose examples partly passed and
# partly were unsupported passed; one failing example among passes failed).
ERROR_CLASS, FAIL_CLASS, KNOWN_CLASS, PASS_CLASS, NOT_RUN_CLASS = CLASSES = ("error", "fail", "known", "pass",
                                                                             "not run")
FAILING = (ERROR_CLASS, FAIL_CLASS)  # a new finding: what turns a cell and the verdict red
STALE_CLASS = "stale"  # a known finding that applied and did not happen: listed apart, never a check's class
UNEXERCISED_CLASS = "unexercised"  # a known finding none of whose examples ran: listed apart, never a check's class
FINDING_CLASSES = (STALE_CLASS, UNEXERCISED_CLASS)  # the classes of the lines that mark a known finding, no outcome
CHECKED = (ERROR_CLASS, FAIL_CLASS, KNOWN_CLASS, PASS_CLASS)  # a line of these says a check ran: it passed or failed


@dataclass(frozen=True)
class Mark:
    """What a cell shows for a class of outcome words: a glyph, and (HTML) a colour."""

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
UNEXERCISED_MARK = Mark("◇", "unexercised", "none of a known finding's examples ran")
PASS = Mark("✓", "pass", "bit-identical, no drift, agrees, within tolerance, rejected as documented")
MARKS = (ERROR, FAIL, KNOWN, UNSUPPORTED, NOT_RUN, SKIPPED, NOT_APPLICABLE, UNEXERCISED_MARK, STALE_MARK, PASS)
_MARK_OF = {**dict.fromkeys(ERRORS, ERROR), **dict.fromkeys(FAILURES, FAIL), "unsupported": UNSUPPORTED,
            "not-run": NOT_RUN, "skipped": SKIPPED, "not-applicable": NOT_APPLICABLE, UNEXERCISED: UNEXERCISED_MARK,
            STALE: STALE_MARK, **dict.fromkeys(PASSING, PASS)}
KNOWN_SUFFIX = " [known]"

# A performance line's words, worst first: a new finding (what fails `nox -s bench`) before a known one, a stale known
# finding before a cell within its limit. A not-timed cell never passes: new, it is red like a slower one.
NOT_TIMED = Mark("–", "not-timed", "could not be timed (the conformance checks say why)", red=True)
PERFORMANCE_SEVERITY = (timings.SLOWER, timings.NOT_TIMED, timings.SLOWER + KNOWN_SUFFIX,
                        timings.NOT_TIMED + KNOWN_SUFFIX, timings.STALE, timings.WITHIN)
_PERFORMANCE_MARK = {timings.SLOWER: FAIL, timings.NOT_TIMED: NOT_TIMED, timings.STALE: STALE_MARK,
                     timings.WITHIN: PASS}


def word(outcome: str, known: str) -> str:
    """A line's word in a cell: its outcome, marked ` [known]` when a known finding predicted it."""
    return f"{outcome}{KNOWN_SUFFIX}" if known and outcome not in (STALE, UNEXERCISED) else outcome


def rank(w: str) -> tuple[int, str]:
    base = w.removesuffix(KNOWN_SUFFIX)
    # A known finding is green: rank it just ahead of the passes, behind every new finding and error.
    return (SEVERITY.index("unsupported") if w.endswith(KNOWN_SUFFIX) else SEVERITY.index(base), w)


def mark(w: str) -> Mark:
    return KNOWN if w.endswith(KNOWN_SUFFIX) else _MARK_OF[w]


def performance_word(outcome: str, known: str) -> str:
    """A performance line's word: marked ` [known]` when a known finding predicted it (only a slower or not-timed cell
    can be predicted; a known finding whose cells were within is a stale line of its own)."""
    return word(outcome, known) if outcome in (timings.SLOWER, timings.NOT_TIMED) else outcome


def performance_rank(w: str) -> tuple[int, str]:
    """Where a performance word sorts: worst first (PERFORMANCE_SEVERITY)."""
    return (PERFORMANCE_SEVERITY.index(w), w)


def performance_mark(w: str) -> Mark:
    """The mark of a performance word: ✓ within, ✗ slower, – not timed, ◆ either as a known finding predicted,
    ◌ stale."""
    return KNOWN if w.endswith(KNOWN_SUFFIX) else _PERFORMANCE_MARK[w]


def says(check: str, w: str) -> str:
    """The word a reader sees for `w` recorded by `check` ("no drift" for the drift check's bit-identical). Displayed
    only: results and report.json keep the stored word, so that one word still means one thing across checks."""
    base = w.removesuffix(KNOWN_SUFFIX)
    return checks.says(check, base) + w[len(base):]


def outcome_class(w: str) -> str:
    """The class of a cell word: error, fail, known, pass or not run (stale or unexercised for a line marking a known
    finding)."""
    if w.endswith(KNOWN_SUFFIX):
        return KNOWN_CLASS
    if w == STALE:
        return STALE_CLASS
    if w == UNEXERCISED:
        return UNEXERCISED_CLASS
    if w in PASSING:
        return PASS_CLASS
    if w in FAILURES:
        return FAIL_CLASS
    return NOT_RUN_CLASS if w in NOT_RAN else ERROR_CLASS


def worst(classes) -> str:
    """The worst of some outcome classes (not run when there are none)."""
    return min(classes, key=CLASSES.index, default=NOT_RUN_CLASS)


def class_of(counts: dict[str, int]) -> str:
    """The class of a set of lines given as word counts (stale and unexercised lines do not count: they are no check's
    outcome)."""
    return worst(c for w in counts if (c := outcome_class(w)) not in FINDING_CLASSES)


def marks(counts: dict[str, int]) -> list[tuple[Mark, int]]:
    """Every mark of some word counts with how many lines have it, the worst (by SEVERITY) first."""
    n: Counter = Counter()
    for w, k in sorted(counts.items(), key=lambda kv: rank(kv[0])):
        n[mark(w)] += k  # insertion order is the order of each mark's worst word
    return list(n.items())


@dataclass(frozen=True)
class Cell:
    """A cell of the report: how many of its lines passed of how many (every line, whatever its word), whether a new
    finding is among them, and the other marks with their counts, worst first."""

    passed: int
    total: int
    red: bool
    others: tuple[tuple[Mark, int], ...]  # every mark but the pass mark

    @property
    def face(self) -> str:
        """What the cell reads as: `passed/total` when anything passed, else its worst mark and that mark's count."""
        if self.passed:
            return f"{self.passed:,}/{self.total:,}"
        m, n = self.others[0]
        return f"{m.glyph}{n:,}"

    @property
    def beside(self) -> tuple[tuple[Mark, int], ...]:
        """The marks counted beside the face (all but the pass mark, and but the face's own mark)."""
        return self.others if self.passed else self.others[1:]

    @property
    def fraction(self) -> float:
        return self.passed / self.total

    @property
    def tone(self) -> str:
        """Its colour class: `red` with a new finding, `f0`-`f10` by the passed fraction (`f10` only when every line
        passed), else (nothing passed) its worst mark's."""
        if self.red:
            return "red"
        if self.passed:
            return f"f{10 if self.passed == self.total else min(9, int(self.fraction * 10))}"
        return self.others[0][0].name


def cell(counts: dict[str, int]) -> Cell | None:
    """The cell of some word counts (None for no lines)."""
    if not counts:
        return None
    all_marks = marks(counts)
    return Cell(passed=sum(n for w, n in counts.items() if w in PASSING), total=sum(counts.values()),
                red=any(outcome_class(w) in FAILING for w in counts),
                others=tuple((m, n) for m, n in all_marks if m is not PASS))
