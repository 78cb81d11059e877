"""This project's own tests: without CUDA they run Triton's interpreter, set before any test module imports triton
(kernels defined in a test module, warm-up processes and pytester runs take it from here); xdist workers size
numpy's BLAS to their share of the CPUs, as the suites' workers do (harness.device.devices.share_blas), since the
interpreter's dots run on it."""

import os

import pytest

from harness.device import devices

if not devices.gpus():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        devices.share_blas(getattr(config.option, "numprocesses", None))
