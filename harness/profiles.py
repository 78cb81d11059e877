"""kvconform's hypothesis profiles, registered under prefixed names (profile names are global to a process, so
they must not collide with a host project's): kvconform-dev, kvconform-ci, kvconform-gpu, kvconform-nightly.

Examples per (release, geometry, check). ci: the CPU interpreter, every recorded release within CI's budget (see
docs/suites.md for the measured cost); gpu: one H200, >= 2,000 examples per release; nightly: more. No deadline in
any: an example's time is never a verdict (a first compile, a cold cache or a loaded host slows one down with
nothing wrong); a hang ends at the per-item limit instead (harness.limits, --kvconform-timeout).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PREFIX = "kvconform-"
PROFILES = {
    "dev": dict(max_examples=10, deadline=None),
    "ci": dict(max_examples=8, deadline=None, database=None, derandomize=True),
    "gpu": dict(max_examples=60, deadline=None, database=None),
    "nightly": dict(max_examples=300, deadline=None, database=None),
}


def register() -> None:
    """Register every profile under its prefixed name."""
    common = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                  report_multiple_bugs=False, print_blob=True)
    for name, values in PROFILES.items():
        settings.register_profile(PREFIX + name, **common, **values)


def load(device: str) -> None:
    """Load KVCONFORM_PROFILE, else gpu on CUDA, else dev (for a run that names no --hypothesis-profile)."""
    settings.load_profile(name(os.environ.get("KVCONFORM_PROFILE", "gpu" if device.startswith("cuda") else "dev")))


def name(short: str) -> str:
    """The registered name of a profile given with or without the prefix."""
    return short if short.startswith(PREFIX) else PREFIX + short
