"""Where a process spends its time, per check and phase of an example: what `bench_suites.py` and every run's
summary print, so that a slowdown is seen the day it lands.

The clock always charges one (check, phase) at a time: entering a phase charges the time so far to the phase it
interrupts, so phases nest and never count twice, and an item's phases add up to its time. Outside every phase an
item is drawing: hypothesis choosing the next example, the strategies building it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping

PHASES = {  # name: what it holds (in the order a kernel example meets them)
    "draw": "hypothesis and the strategies drawing the example",
    "cache": "allocating and poisoning caches, writing the example's tokens through its page table",
    "setting": "entering and leaving the layer's release (layout setting, replayed stand-in modules)",
    "subject": "the subject's own calls",
    "sync": "waiting for the device after a subject call",
    "check": "the check's own work around them (reading views back, its host-side logic)",
    "compare": "comparing outputs and views",
    "record": "writing result lines",
}


class Clock:
    """Seconds (of `now`, a monotonic clock) and examples of one process, per check and phase."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self.seconds: dict[tuple[str, str], float] = {}
        self.examples: dict[str, int] = {}
        self._check = ""
        self._phase = "draw"
        self._since = 0.0

    def _charge(self) -> None:
        now = self._now()
        if self._check:
            key = (self._check, self._phase)
            self.seconds[key] = self.seconds.get(key, 0.0) + now - self._since
        self._since = now

    @contextlib.contextmanager
    def item(self, check: str) -> Iterator[None]:
        """Charge what happens meanwhile to `check` (drawing, outside every phase)."""
        self._charge()
        outer, self._check, self._phase = (self._check, self._phase), check, "draw"
        try:
            yield
        finally:
            self._charge()
            self._check, self._phase = outer

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge what happens meanwhile to phase `name` of the current check."""
        self._charge()
        outer, self._phase = self._phase, name
        try:
            yield
        finally:
            self._charge()
            self._phase = outer

    def example(self) -> None:
        """One more example of the current check."""
        self.examples[self._check] = self.examples.get(self._check, 0) + 1

    def report(self) -> dict[str, dict[str, float]]:
        """Per check: its examples and the seconds of each phase, as JSON takes it."""
        out: dict[str, dict[str, float]] = {}
        for (check, phase), s in self.seconds.items():
            out.setdefault(check, {"examples": self.examples.get(check, 0)})[phase] = round(s, 4)
        return out


CLOCK = Clock()  # this process's


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    """This process's clock in phase `name` meanwhile."""
    return CLOCK.phase(name)


def merged(reports: list[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """The processes' reports (Clock.report) added up."""
    out: dict[str, dict[str, float]] = {}
    for report in reports:
        for check, figures in report.items():
            into = out.setdefault(check, {})
            for key, value in figures.items():
                into[key] = into.get(key, 0) + value
    return out


def per_example(figures: Mapping[str, float]) -> dict[str, float]:
    """Milliseconds per example of one check, in total and per phase."""
    n = max(int(figures.get("examples", 0)), 1)
    phases = {p: 1000 * figures[p] / n for p in PHASES if figures.get(p)}
    return {"total": sum(phases.values()), **phases}


def lines(report: Mapping[str, Mapping[str, float]]) -> list[str]:
    """One line per check: its examples, its cost per example, and the phases that cost."""
    out = []
    for check, figures in sorted(report.items(), key=lambda kv: -sum(v for k, v in kv[1].items() if k in PHASES)):
        ms = per_example(figures)
        parts = ", ".join(f"{p} {ms[p]:.2f}" for p in PHASES if p in ms)
        seconds = sum(v for k, v in figures.items() if k in PHASES)
        out.append(f"cost {check}: {int(figures.get('examples', 0))} examples, {seconds:.1f} s, "
                   f"{ms['total']:.2f} ms/example ({parts})")
    return out
