"""The example loop: one check over hypothesis-drawn examples of one target, under the item's time limit, each
example's outcome recorded, what does not pass matched against the subject's known findings.

On a new finding the loop raises `NewFinding` with ONE line that reproduces it; the shrunk example is kept
(harness.run.regressions). Anything the subject returns or raises is the subject's outcome; `harness-error` is kept
for kvconform's own bugs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import hypothesis
from hypothesis import given, settings

from harness.checks import Check
from harness.checks.outcome import Outcome
from harness.device import costs, limits
from harness.draws import profiles
from harness.draws.strategies import alike
from harness.results import Word, findings
from harness.run import implementation, regressions
from harness.run.implementation import Drawn
from harness.run.regressions import Regression
from harness.run.releases import ReleaseContracts
from harness.run.session import Session
from harness.run.targets import Target, examples_per_item, item_seed
from harness.run.trial import NotRun, Poisoned, SubjectRefused, Trial, Verdict

CheckFn = Callable[[Trial], Outcome]


HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # harness/: frames of it are not the subject's


def _subject_frames(e: BaseException | None) -> BaseException | None:
    """`e`, what the subject raised, with its traceback from the subject's own frames on (the harness frames that
    called it cut off): a new finding's cause shows where in the subject it went wrong."""
    if e is None:
        return None
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(HARNESS + os.sep):
        tb = tb.tb_next
    return e.with_traceback(tb)


class NewFinding(AssertionError):
    """An outcome no known finding predicts; its message ends with the REPRO line."""


class TimedOut(Exception):
    """An item ran past its time limit (harness.device.limits): recorded as `timeout` with the example it was
    running."""


class DeviceLost(BaseException):
    """The device of this process is unusable; the example is recorded and kept. Whoever runs the process ends it."""


@dataclass
class Settled:
    """How an item ended when it found nothing new: the known findings that happened, reasons examples were not
    run, reasons the subject gave for not supporting them, and how many ran."""

    ran: int = 0
    not_run: set[str] = field(default_factory=set)
    unsupported: set[str] = field(default_factory=set)
    known: dict[str, findings.Finding] = field(default_factory=dict)
    failure: tuple[Trial, Outcome] | None = None


class Loop:
    """Runs one check over examples of one target and records what happened. `replays` is how a command names the
    items that replay kept examples of this check (the REPRO line selects one with -k), `item` how it names this
    item, each ready to paste (quoted); the session's `command` starts them."""

    def __init__(self, session: Session, replays: str, max_examples: int | None = None, item: str = "",
                 timeout: float = 0.0):
        self.s = session
        self.replays = replays
        self.max_examples = max_examples
        self.item = item or replays  # what a timeout names
        self.timeout = timeout  # seconds an item may run (0: no limit)
        self._current: Trial | None = None  # what a timeout's line names: the watchdog cannot ask the main thread

    def trial(self, target: Target, check: str, ex: Drawn, extra: object) -> Trial:
        """The value a check receives for one example of `target`."""
        return Trial(target, check, ex, extra, self.s.subject, self.s.device)

    def run(self, target: Target, check: Check, body: CheckFn | None = None) -> Settled:
        """Check `check` over generated examples of `target`: its budget (harness.checks), its implementation's draws
        and explicit examples (harness.run.implementation), its body or `body`; raises NewFinding only on a new
        finding. A target of one sparsity mode (its own, or the one its check takes) gets its share of the
        examples."""
        if check.mode and not target.mode:
            target = replace(target, mode=check.mode)
        state = Settled()
        sizes = self.s.sizes
        it = implementation.of(check)
        fn = body or it.body
        count = examples_per_item(check, self.max_examples or settings.default.max_examples, target.mode)

        @settings(max_examples=count)
        @given(ex=it.examples(target, sizes), extra=it.extra())
        def generated(ex: Drawn, extra) -> None:
            self._one(self.trial(target, check.name, ex, extra), it, fn, state)

        # Hypothesis runs the example attached last first: attached in reverse, they run in the order declared.
        for ex, value in reversed(it.explicit(target, sizes)):
            generated = hypothesis.example(ex=ex, extra=value)(generated)
        generated = hypothesis.seed(item_seed(self.s.seed, check.name, target))(generated)
        return self._limited(target, check.name, state, generated)

    def replay(self, regression: Regression, check: Check, body: CheckFn | None = None) -> Settled:
        """Run one stored regression example."""
        state = Settled()
        it = implementation.of(check)
        trial = self.trial(regression.target, check.name, regression.example, regression.extra)
        return self._limited(regression.target, check.name, state,
                             lambda: self._one(trial, it, body or it.body, state))

    def _limited(self, target: Target, check: str, state: Settled, body) -> Settled:
        try:
            with costs.CLOCK.item(check), self.s.sink.batched(), limits.time_limit(self.timeout, self._hung), alike():
                body()
        except limits.ItemTimeout as e:
            raise TimedOut(self._record_timeout(str(e))) from None
        except BaseException:
            if state.failure is not None:  # the last failing example seen is the shrunk one hypothesis reports
                trial, outcome = state.failure
                self._record(trial, outcome)
                regressions.keep(self.s, trial.target, trial.check, trial.example, trial.extra)
            raise
        return state

    def _record_timeout(self, what: str) -> str:
        message = f"timeout: {self.item} {what} (a harness limit, --kvconform-timeout; not a verdict)"
        t = self._current
        if t is None:
            self.s.sink.write(self.s.releases[0], "*", "*", "*", Word.TIMEOUT, message, device=self.s.device)
            return message
        repro = self.repro(t)
        self.s.sink.write(t.target.release, t.target.geometry, t.check, t.example.mode, Word.TIMEOUT,
                          f"{message}; running example {t.example.digest()}", case=t.example.digest(), repro=repro,
                          device=self.s.device, **t.target.described)
        return f"{message}\n{repro}"

    def _hung(self) -> None:
        # From the watchdog thread: the main thread is stuck where the alarm cannot reach it.
        message = self._record_timeout(f"ran past its limit of {self.timeout:g} s and did not return within "
                                       f"{min(limits.GRACE, self.timeout):g} s more: this process is ended")
        self.s.say(f"kvconform {message}")
        self.s.sink.flush()
        os._exit(3)

    def _one(self, t: Trial, it: implementation.Implementation, fn: CheckFn, state: Settled) -> None:
        self._current = t
        costs.CLOCK.example()
        start = time.perf_counter()
        raised = reason = None  # what the subject raised, when its outcome is that; why it does not take the example
        try:
            with costs.phase("check"):
                reason = it.refusal(t, self.s)
                outcome = None if reason else fn(t)
        except SubjectRefused as e:
            reason = str(e)
        except Verdict as v:
            outcome, raised = v.outcome, v.__cause__
        except NotRun as e:
            state.not_run.add(str(e))
            if state.failure is None:
                self._record(t, Outcome(Word.NOT_RUN, str(e)))
            return
        except Poisoned as p:
            self._end_process(t, p.outcome)
        except Exception as e:
            state.failure = (t, Outcome(Word.HARNESS_ERROR, f"{type(e).__name__}: {e}"))
            raise
        if reason:
            state.unsupported.add(reason)
            if state.failure is None:
                self._record(t, Outcome(Word.UNSUPPORTED, reason))
            return
        state.ran += 1
        known = None
        if not outcome.word.passing:
            known = findings.match(self.s.findings, t.target.release.release, t.target.geometry, t.example.mode,
                                   t.check, outcome.word)
            if known is None:
                state.failure = (t, outcome)
                raise NewFinding(f"{outcome.word.value}: {outcome.diagnosis}\n{self._unshrunk()}"
                                 f"{self.repro(t, outcome.where)}") from _subject_frames(raised)
            state.known[known.id] = known
        if state.failure is None:  # examples tried while shrinking a failure are not results
            self._record(t, outcome, known.id if known else "", time.perf_counter() - start)

    def _unshrunk(self) -> str:
        """Under a profile that does not shrink, the line that gets this item's shrunk example."""
        if profiles.shrinks():
            return ""
        return (f"the first failing example found, not shrunk ({settings.get_current_profile_name()}); the shrunk "
                f"one: {self.command(self.item)} --hypothesis-profile=kvconform-ci\n")

    def _end_process(self, t: Trial, outcome: Outcome) -> None:
        self._record(t, outcome)
        self.s.sink.flush()  # the line a crashed worker's culprit is read from, before the process ends
        regressions.keep(self.s, t.target, t.check, t.example, t.extra)
        message = f"kvconform {outcome.word.value}: {outcome.diagnosis}\n{self.repro(t)}"
        print(message, file=sys.__stderr__, flush=True)
        raise DeviceLost(message)

    def repro(self, t: Trial, where: str = "") -> str:
        """ONE line that reproduces the trial's example: what it is, where the check found it wrong, and the
        command that replays it."""
        return regressions.repro(t.target, t.check, t.example, t.extra, self.command(self.replays), where)

    def command(self, item: str) -> str:
        """The command that runs `item` (as a command names it) as this session ran it."""
        return f"{self.s.command} {item} {self.s.args}"

    def _record(self, t: Trial, outcome: Outcome, known: str = "", seconds: float = 0.0) -> None:
        with costs.phase("record"):
            self._write(t, outcome, known, seconds)

    def _write(self, t: Trial, outcome: Outcome, known: str, seconds: float) -> None:
        self.s.sink.write(t.target.release, t.target.geometry, t.check, t.example.mode, outcome.word,
                          outcome.diagnosis, case=t.example.digest(),
                          repro=self.repro(t, outcome.where) if not outcome.word.passing else "", known=known,
                          device=self.s.device,
                          seconds=round(seconds, 4), **t.target.described)

    def record_target(self, target: Target, check: Check, word: Word, diagnosis: str = "") -> None:
        """Record an outcome of a whole (release, geometry) item, e.g. a check that cannot run here."""
        self.s.sink.write(target.release, target.geometry, check.name, "*", Word(word), diagnosis,
                          device=self.s.device, **target.described)

    def record_release(self, r: ReleaseContracts, check: Check, word: Word, diagnosis: str = "") -> str:
        """Record a whole-release outcome (contracts unreadable, drift); the known finding's id if one predicts it."""
        word = Word(word)
        known = findings.match(self.s.findings, r.release, "*", "*", check.name, word.value)
        self.s.sink.write(r, "*", check.name, "*", word, diagnosis, known=known.id if known else "")
        return known.id if known else ""
