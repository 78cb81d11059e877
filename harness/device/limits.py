"""The per-item time limit: a hang ends as its own outcome (`timeout`), never as a verdict on the subject.

No hypothesis deadline judges an example (a first compile or a loaded host makes one slow without anything being
wrong); an item instead has a wall-clock limit. At the limit an alarm raises `ItemTimeout` in the main thread,
which the runner records with the example it was running. Code that never returns to Python (a hung device wait)
does not see the alarm: a watchdog thread then calls `on_hang` (which records and ends the process; under xdist a
fresh worker takes the remaining items) when the alarm has not ended the block after a grace of GRACE seconds or
the limit itself, whichever is shorter.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

GRACE = 30.0  # at most this long the main thread has to take the alarm before the watchdog ends the process
DEFAULTS = {"cuda": 600.0, "cpu": 3600.0}  # seconds per item by device kind: the interpreter is ~1000x slower


def item_limit(option: float | None, device: str) -> float:
    """Seconds one item may run on `device`: the option (0: no limit), else the device kind's default."""
    return DEFAULTS[device.split(":")[0]] if option is None else option


class ItemTimeout(BaseException):
    """An item ran past its limit. A BaseException so that neither hypothesis nor a subject's `except Exception`
    takes it for a failing example."""

    def __init__(self, seconds: float):
        super().__init__(f"ran past its limit of {seconds:g} s")
        self.seconds = seconds


@contextlib.contextmanager
def time_limit(seconds: float, on_hang: Callable[[], None]) -> Iterator[None]:
    """Raise ItemTimeout in this thread after `seconds` (none when 0); call `on_hang` from a watchdog thread when
    the thread is still inside the block a grace (GRACE, or `seconds` when shorter) after that."""
    if not seconds:
        yield
        return
    main = threading.current_thread() is threading.main_thread()
    if main:
        def alarm(signum, frame):
            raise ItemTimeout(seconds)

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    watchdog = threading.Timer(seconds + min(GRACE, seconds) if main else seconds, on_hang)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
