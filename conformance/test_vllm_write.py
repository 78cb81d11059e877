"""kvconform.suites.test_vllm_write, run by this repository's own CI."""

from kvconform.suites.test_vllm_write import *  # noqa: F401,F403
