"""This project's own tests: xdist workers size numpy's BLAS to their share of the CPUs, as the suites' workers do
(harness.devices.share_blas); the Triton interpreter's dots in these tests run on it."""

import pytest

from harness import devices


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    workers = getattr(config.option, "numprocesses", None)
    if not hasattr(config, "workerinput") and isinstance(workers, int) and workers > 0:
        devices.share_blas(workers)
