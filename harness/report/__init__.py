"""The conformance report, standard library only: every session's result lines folded into the report's data (fold,
what report.json holds) and rendered as report.md (markdown) and as one offline HTML page (html), from what a cell
says (cells), the keys runs are compared on (keys), what changed since a previous report (changes), each cell's
history and the last build that passed (history), the failures only one release, backend or cache dtype has
(lone_failures) and the texts both pages share (sections); `python -m harness.report` writes the three files
(__main__)."""
