"""kvconform's hypothesis profiles, registered under prefixed names (profile names are global to a process, so
they must not collide with a host project's): kvconform-dev, kvconform-ci, kvconform-find, kvconform-gpu,
kvconform-nightly, kvconform-generated.

Examples per (release, geometry, check). ci: the CPU interpreter, every recorded release within CI's budget (see
docs/suites.md for the measured cost); find: ci's examples without the shrink phase, so that an item stops at its
first failing example (a wrong subject over the whole matrix in minutes; the item's shrunk example is one rerun
under ci away); generated: find without the explicit examples, so that what the generated examples alone catch is
counted (benchmarks/kill_power.py; the explicit examples catch most planted bugs by themselves); gpu: one H200, >=
2,000 examples per release; nightly: more. No deadline in any: an example's time is never a verdict (a first
compile, a cold cache or a loaded host slows one down with nothing wrong); a hang ends at the per-item limit instead
(harness.device.limits, --kvconform-timeout).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument

PREFIX = "kvconform-"
PROFILES = {
    "dev": dict(max_examples=10, deadline=None),
    "ci": dict(max_examples=8, deadline=None, database=None, derandomize=True),
    "find": dict(max_examples=8, deadline=None, database=None, derandomize=True,
                 phases=(Phase.explicit, Phase.reuse, Phase.generate)),
    "gpu": dict(max_examples=60, deadline=None, database=None),
    "nightly": dict(max_examples=300, deadline=None, database=None),
    "generated": dict(max_examples=8, deadline=None, database=None, derandomize=True, phases=(Phase.generate,)),
}


def register() -> None:
    """Register every profile under its prefixed name."""
    common = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                  report_multiple_bugs=False, print_blob=True)
    for name, values in PROFILES.items():
        settings.register_profile(PREFIX + name, **common, **values)


def load(device: str) -> None:
    """Load KVCONFORM_PROFILE, else gpu on CUDA, else dev (for a run that names no --hypothesis-profile)."""
    short = os.environ.get("KVCONFORM_PROFILE", "gpu" if device.startswith("cuda") else "dev")
    if name(short) not in registered():
        raise ValueError(f"KVCONFORM_PROFILE={short}: no such profile; kvconform's: {', '.join(PROFILES)}")
    settings.load_profile(name(short))


def registered() -> list[str]:
    """kvconform's profile names, registered."""
    return [PREFIX + n for n in PROFILES]


def check_named(profile: str) -> None:
    """ValueError naming kvconform's profiles unless `profile` (a --hypothesis-profile value) is registered, by
    kvconform or by the project's own conftest."""
    try:
        settings.get_profile(profile)
    except InvalidArgument:
        raise ValueError(f"--hypothesis-profile={profile}: no such profile; kvconform's: {', '.join(registered())} "
                         "(or one the project's conftest registers)") from None


def shrinks() -> bool:
    """The loaded profile shrinks a failing example (kvconform-find does not)."""
    return Phase.shrink in settings.default.phases


def explicit() -> bool:
    """The loaded profile runs the explicit examples (kvconform-generated does not)."""
    return Phase.explicit in settings.default.phases


def name(short: str) -> str:
    """The registered name of a profile given with or without the prefix."""
    return short if short.startswith(PREFIX) else PREFIX + short
