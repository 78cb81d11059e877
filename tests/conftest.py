import pytest


@pytest.fixture
def not_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest run this test starts is not an xdist worker, even when this test runs in one: the worker
    variables it would inherit are removed."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(name, raising=False)
