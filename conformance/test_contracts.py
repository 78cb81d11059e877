"""kvconform.suites.test_contracts, run by this repository's own CI."""

from kvconform.suites.test_contracts import *  # noqa: F401,F403
