"""This repository's suites are kvconform's own (kvconform.suites), run by its plugin (pyproject: -p kvconform)."""

KVCONFORM_SUITES = True  # the plugin is active here without --kvconform-* options (a live vLLM run names none)
