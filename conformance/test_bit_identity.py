"""kvconform.suites.test_bit_identity, run by this repository's own CI."""

from kvconform.suites.test_bit_identity import *  # noqa: F401,F403
