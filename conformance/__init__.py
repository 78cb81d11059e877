"""The conformance checks, one module per check: `pytest --pyargs kvconform.suites --kvconform-subject ...`."""
