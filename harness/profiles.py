"""kvconform's hypothesis profiles, registered under prefixed names (profile names are global to a process, so
they must not collide with a host project's): kvconform-dev, kvconform-ci, kvconform-gpu, kvconform-nightly.

Examples per (release, geometry, check). ci: the CPU interpreter, every recorded release within CI's budget (see
docs/suites.md for the measured cost); gpu: one H200, >= 2,000 examples per release; nightly: more. No deadline on
CPU (the interpreter's speed depends on the machine's load); on GPU a generous one that a first compile of a new
constexpr combination (seconds) stays under, so that only a hang or a pathological slow-down trips.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, settings

PREFIX = "kvconform-"
PROFILES = {
    "dev": dict(max_examples=10, deadline=None),
    "ci": dict(max_examples=8, deadline=None, database=None, derandomize=True),
    "gpu": dict(max_examples=60, deadline=timedelta(seconds=20), database=None),
    "nightly": dict(max_examples=300, deadline=timedelta(seconds=60), database=None),
}


def register() -> None:
    """Register every profile under its prefixed name."""
    common = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                  report_multiple_bugs=False, print_blob=True)
    for name, values in PROFILES.items():
        settings.register_profile(PREFIX + name, **common, **values)


def name(short: str) -> str:
    """The registered name of a profile given with or without the prefix."""
    return short if short.startswith(PREFIX) else PREFIX + short
