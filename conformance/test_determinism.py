"""kvconform.suites.test_determinism, run by this repository's own CI."""

from kvconform.suites.test_determinism import *  # noqa: F401,F403
