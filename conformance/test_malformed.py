"""kvconform.suites.test_malformed, run by this repository's own CI."""

from kvconform.suites.test_malformed import *  # noqa: F401,F403
