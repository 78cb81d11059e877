"""Known findings: matching by release range, geometry, sparsity, check and outcome; malformed files rejected."""

from importlib import metadata

import pytest

from harness.results import findings
from harness.results.findings import FindingsError

ENTRY = """[[finding]]
releases = "{releases}"
geometry = "{geometry}"
sparsity = "{sparsity}"
check = "{check}"
outcome = "{outcome}"
reason = "why"
link = "issue 5"
"""


def write(tmp_path, *entries, subject="subj"):
    (tmp_path / f"{subject}.toml").write_text("".join(ENTRY.format(**{
        "releases": "*", "geometry": "*", "sparsity": "*", "check": "*", "outcome": "differs", **e}) for e in entries))
    return findings.load(subject, tmp_path)


def test_no_file_means_no_known_findings(tmp_path):
    assert findings.load("nobody", tmp_path) == ()


def test_the_builtin_file_loads():
    assert findings.load("builtin") == ()


def test_ids_count_entries_in_file_order(tmp_path):
    fs = write(tmp_path, {}, {"check": "oracle"})
    assert [f.id for f in fs] == ["subj#1", "subj#2"]


@pytest.mark.parametrize("spec, release, hit", [
    (">=0.26.0", "0.26.0", True), (">=0.26.0", "0.25.1", False), ("<0.10", "0.9.2", True),
    (">=0.8,<0.9", "0.8.5.post1", True), ("*", "main", True), ("main", "main", True), (">=0.1", "main", False),
    ("main", "0.33.0", False), ("*", "0.33.0", True),
])
def test_release_ranges(tmp_path, spec, release, hit):
    fs = write(tmp_path, {"releases": spec})
    assert (findings.match(fs, release, "kv-first:KV.B.N.H.D", "none", "bit-identity", "differs") is not None) == hit


def test_globs_and_exact_outcome(tmp_path):
    fs = write(tmp_path, {"geometry": "packed:*", "sparsity": "nm", "check": "bit-*", "outcome": "contract-error"})
    assert findings.match(fs, "0.30.0", "packed:B.H.N.C", "nm", "bit-identity", "contract-error").id == "subj#1"
    assert findings.match(fs, "0.30.0", "packed:B.H.N.C", "nm", "bit-identity", "differs") is None
    assert findings.match(fs, "0.30.0", "kv-first:KV.B.N.H.D", "nm", "bit-identity", "contract-error") is None
    assert findings.match(fs, "0.30.0", "packed:B.H.N.C", "none", "bit-identity", "contract-error") is None
    assert findings.match(fs, "0.30.0", "packed:B.H.N.C", "nm", "oracle", "contract-error") is None
    assert fs[0].applies("0.30.0", "packed:B.N.H.C", "nm", "bit-identity")


@pytest.mark.parametrize("entry, message", [
    ({"outcome": "broken"}, "outcome 'broken' is not one of"),
    ({"outcome": "stale"}, "outcome 'stale' is not one of"),  # marks a finding; no finding can predict it
    ({"outcome": "unexercised"}, "outcome 'unexercised' is not one of"),
    ({"releases": ">>0.1"}, "not a PEP 440 specifier"),
])
def test_malformed_entries_are_rejected(tmp_path, entry, message):
    with pytest.raises(FindingsError, match=message):
        write(tmp_path, entry)


def test_missing_or_extra_keys_are_rejected(tmp_path):
    (tmp_path / "s.toml").write_text('[[finding]]\nreleases = "*"\nwhy = "x"\n')
    with pytest.raises(FindingsError, match="expected exactly"):
        findings.load("s", tmp_path)
    (tmp_path / "t.toml").write_text("[[finding]\n")
    with pytest.raises(FindingsError, match="not valid TOML"):
        findings.load("t", tmp_path)


def test_a_finding_of_a_package_release_applies_only_where_that_release_is_installed(tmp_path):
    version = metadata.version("pytest")
    (tmp_path / "s.toml").write_text(ENTRY.format(releases="*", geometry="*", sparsity="*", check="*",
                                                  outcome="differs")
                                     + f'package = "pytest=={version}"\n'
                                     + ENTRY.format(releases="*", geometry="*", sparsity="*", check="*",
                                                    outcome="unsupported")
                                     + 'package = "pytest==0.0.1"\n'
                                     + ENTRY.format(releases="*", geometry="*", sparsity="*", check="*",
                                                    outcome="subject-error")
                                     + 'package = "kvconform-no-such-package==1.0"\n')
    # the entries keep their ids in file order; the ones of releases not installed are not among the findings
    assert [(f.id, f.outcome) for f in findings.load("s", tmp_path)] == [("s#1", "differs")]
    (tmp_path / "t.toml").write_text(ENTRY.format(releases="*", geometry="*", sparsity="*", check="*",
                                                  outcome="differs") + 'package = "pytest"\n')
    with pytest.raises(FindingsError, match="t.toml finding 1: package 'pytest' is not `name==release`"):
        findings.load("t", tmp_path)
