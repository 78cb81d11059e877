"""kvconform.suites.test_oracle, run by this repository's own CI."""

from kvconform.suites.test_oracle import *  # noqa: F401,F403
