"""kvconform.suites.test_split, run by this repository's own CI."""

from kvconform.suites.test_split import *  # noqa: F401,F403
