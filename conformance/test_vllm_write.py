"""vllm-write: K/V written by vLLM's own CUDA cache-write op land exactly where the release's contract says, and
nowhere else (harness.checks.vllm_write). Needs a CUDA device and vLLM installed (a live session); anywhere else each
target is reported as skipped, with the reason, never as passed."""

import pytest

from harness import checks
from harness.checks import vllm_write
from harness.results import Word

CHECK = checks.VLLM_WRITE  # its declaration: what it needs, costs and draws


def test_vllm_write(conformance, target):
    reason = vllm_write.skipped(target)
    if reason:
        conformance.record_target(target, CHECK, Word.SKIPPED, reason)
        pytest.skip(reason)
    conformance.run(target, CHECK)
