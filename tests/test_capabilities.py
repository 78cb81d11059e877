"""Subjects declare capabilities (split, transfer, forward) and checks declare what they need (`Check.needs`): a
KV-cache consumer that runs no attention gets the checks it can take and, for each other check, one not-applicable
line per release (never a pass, never a finding) and no pytest item."""

import json
import re

import pytest

from harness import results
from harness.report import cells
from harness.report.fold import report_data
from harness.report.markdown import report_md
from harness.run import session as sessions
from harness.subjects import DEFAULT_CAPABILITIES, capabilities_of

pytest_plugins = ["pytester"]

CONSUMER = '''
"""A host project's KV-cache consumer (an RL framework reading the cache): a split, no attention, no supports."""
from harness.handed.layer import kv_views


class Correct:
    name = "consumer-correct"
    capabilities = frozenset({"split"})

    def split(self, kv_cache, layer):
        return kv_views(kv_cache, layer)


class Unbinds(Correct):
    """K and V are kv_cache.unbind(0)[:2], whatever the release (right on kv-first only)."""

    name = "consumer-unbinds"

    def split(self, kv_cache, layer):
        kv_views(kv_cache, layer)  # the same shape checks as Correct: a malformed cache is refused alike
        k, v, *_ = kv_cache.unbind(0)
        return k, v
'''
FAMILIES = ("0.22.1", "0.25.1", "0.33.0")  # kv-first, blocks-first, packed
FORWARD_CHECKS = {"bit-identity", "determinism", "oracle"}


@pytest.fixture
def host(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(consumer=CONSUMER)
    return pytester


def _suites(host, subject, *args):
    return host.runpytest_subprocess("--pyargs", "kvconform.suites", "-p", "no:cacheprovider", "-q", "-rA",
                                     f"--kvconform-subject=consumer:{subject}",
                                     *[f"--kvconform-release={r}" for r in FAMILIES], "--kvconform-backend=FLASH_ATTN",
                                     "--kvconform-cache-dtype=auto",
                                     "--hypothesis-profile=kvconform-ci", "--kvconform-max-examples=1", *args)


def _outcomes(out: str) -> dict[str, str]:
    return {item: word for word, item in re.findall(r"^(PASSED|FAILED|SKIPPED|XFAIL|ERROR) \S*::(\S+)", out, re.M)}


def _rows(root):
    return [json.loads(line) for f in root.glob("*/results.jsonl") for line in f.read_text().splitlines()]


def test_a_correct_consumer_is_green_and_gets_no_forward_check(host):
    done = _suites(host, "Correct", "-k", "split or malformed or bit_identity or determinism or oracle or transfer")
    out = done.stdout.str()
    assert done.ret == 0, out[-3000:]
    got = _outcomes(out)
    assert got and set(got.values()) == {"PASSED"}, got
    assert {i.split("[")[0] for i in got} == {"test_split_agrees", "test_rejects_malformed"}, got
    assert {r for i in got for r in FAMILIES if f"[{r}-" in i} == set(FAMILIES)
    assert "deselected" in out.splitlines()[-1]  # the forward and transfer checks: no items at all
    rows = _rows(host.path / "results")
    na = [r for r in rows if r["outcome"] == "not-applicable"]
    assert sorted((r["release"], r["check"]) for r in na) == sorted(
        (rel, c) for rel in FAMILIES for c in FORWARD_CHECKS | {"transfer", "model-transfer"})  # a line per release, check
    assert all(r["geometry"] == "*" and "declares split" in r["diagnosis"] for r in na)
    assert {r["outcome"] for r in rows if r["check"] in FORWARD_CHECKS} == {"not-applicable"}
    data = report_data(results.read(host.path / "results"))
    assert data.verdict.startswith("GREEN") and not data.new_findings
    assert "∅" in report_md(data) and cells.mark("not-applicable") is not cells.mark("unsupported")


def test_a_consumer_that_unbinds_axis_0_is_red_with_repro_lines_on_blocks_first_and_packed(host):
    done = _suites(host, "Unbinds", "-k", "split_agrees")
    out = done.stdout.str()
    assert done.ret == 1, out[-3000:]
    got = _outcomes(out)
    failed = {i for i, w in got.items() if w == "FAILED"}
    # 0.33.0: its 9 packed geometries and the 4 FLASH_ATTN model layers handed packed views at an offset
    # (harness.run.targets.InModel)
    assert failed == {i for i in got if "[0.25.1-" in i or "[0.33.0-" in i} and len(failed) == 4 + 9 + 4, got
    assert all(w == "PASSED" for i, w in got.items() if "[0.22.1-" in i), got
    repros = re.findall(r"REPRO split-agrees release=(\S+) \(replay\) geometry=(\S+)", out)
    assert {r for r, _ in repros} == {"0.25.1", "0.33.0"}, out[-3000:]
    assert "harness-error" not in out  # what it raises (a 1-block cache has no [1] to unbind) is its own outcome


def test_a_subject_without_capabilities_is_a_kernel_as_before():
    class Kernel:
        name = "k"

        def split(self): ...
        def tile_config(self): ...
        def paged_forward(self): ...
        def dense_forward(self): ...

    assert capabilities_of(Kernel()) == DEFAULT_CAPABILITIES == {"split", "forward"}


@pytest.mark.parametrize("caps, says", [
    ({"split", "attention"}, "unknown attention"),
    (set(), "none declared"),
    ({"split", "transfer"}, "transfer needs extract; transfer needs inject"),
])
def test_a_bad_capability_declaration_is_a_usage_error(caps, says):
    subject = type("S", (), {"name": "s", "capabilities": frozenset(caps), "split": lambda self, *a: None})()
    with pytest.raises(ValueError, match=says):
        capabilities_of(subject)


def test_checks_declare_what_they_need():
    from kvconform.suites import (
        test_bit_identity,
        test_contracts,
        test_determinism,
        test_malformed,
        test_oracle,
        test_split,
        test_transfer,
        test_vllm_write,
    )

    needs = {m.CHECK.name: m.CHECK.needs for m in (test_bit_identity, test_contracts, test_determinism,
                                                   test_malformed, test_oracle, test_split, test_transfer,
                                                   test_vllm_write)}
    consumer = sessions.Session("c", "c", None, [], (), None, None, "w", "", "cpu", capabilities=frozenset({"split"}))
    applies = {c for c, n in needs.items() if not consumer.missing(n)}
    assert applies == {"contracts", "vllm-write", "split-agrees", "rejects-malformed"}
    kernel = sessions.Session("k", "k", None, [], (), None, None, "w", "", "cpu")
    assert {c for c, n in needs.items() if kernel.missing(n)} == {"transfer"}


def test_ulp_autotuned_needs_a_subject_that_autotunes():
    from kvconform.suites import test_ulp_autotuned

    kernel = sessions.Session("k", "k", None, [], (), None, None, "w", "", "cpu")
    assert kernel.missing(test_ulp_autotuned.CHECK.needs) == ["autotune"]
    tuning = sessions.Session("t", "t", None, [], (), None, None, "w", "", "cpu",
                            capabilities=frozenset({"split", "forward", "autotune"}))
    assert not tuning.missing(test_ulp_autotuned.CHECK.needs)
    lacking = type("S", (), {"name": "s", "capabilities": frozenset({"split", "forward", "autotune"}),
                             **{m: lambda self, *a: None for m in ("split", "tile_config", "paged_forward",
                                                                   "dense_forward")}})()
    with pytest.raises(ValueError, match="autotune needs autotune_configs"):
        capabilities_of(lacking)


SPEC_IN_A_FRESH_PROCESS = """
from harness.subjects import load_subject
from kvconform.subjects import spec
for name in ("mutant:table_row", "modelopt", "builtin"):
    print(type(load_subject(spec(name))).__name__, load_subject(spec(name)).name)
try:
    load_subject("modelopt")
except ValueError as e:
    print(e)
"""


def test_kvconforms_own_subjects_are_a_module_class_the_core_loads_in_any_process():
    import os
    import subprocess
    import sys
    from pathlib import Path

    from kvconform.subjects import own, spec

    assert spec("modelopt") == "kvconform.subjects.modelopt:ModeloptSubject"
    assert spec("mutant:gqa_mapping") == "kvconform.subjects.mutants:gqa_mapping"
    assert spec("builtin") == "builtin" and spec("mypkg.attention:Reader") == "mypkg.attention:Reader"
    assert own("builtin") and own("modelopt") and own("mutant:gqa_mapping") and not own("mypkg.attention:Reader")
    assert spec("contiguous-views") == "kvconform.subjects.slow:ContiguousViews" and own("contiguous-views")
    assert spec("lmcache-mp") == "kvconform.subjects.lmcache_mp:LMCacheMP" and own("lmcache-mp")
    assert spec("vllm-example") == "kvconform.subjects.vllm_example:VllmExample" and own("vllm-example")
    with pytest.raises(ValueError, match=re.escape("unknown subject 'nope'; known: ['builtin', 'contiguous-views', "
                                                   "'lmcache-mp', 'modelopt', 'vllm-example'], mutant:<name> or "
                                                   "module:Class")):
        spec("nope")
    with pytest.raises(ValueError, match="unknown mutant 'nope'; known: "):
        spec("mutant:nope")
    # What a warm-up process does: load the subject again by the spec alone, with no name table of the plugin's.
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", SPEC_IN_A_FRESH_PROCESS], cwd=repo, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "BuiltinSubject builtin[mutant table_row]", "ModeloptSubject modelopt", "BuiltinSubject builtin",
        "unknown subject 'modelopt'; a subject is builtin or module:Class"], done.stdout



class NoDiffKV:
    """Refuses a cache whose V head size is not K's: a subject that reads one head size."""

    name = "no-diffkv"
    capabilities = frozenset({"split"})

    def supports_layer(self, layer):
        return "V's head size unlike K's" if layer.head_size_v != layer.head_size else None

    def split(self, kv_cache, layer):
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)}")


def test_the_header_lists_the_diff_kv_geometries_a_subject_refuses(tmp_path):
    # Asked at the sizes the examples draw (V narrower and wider than K), not at one head size for both.
    from harness.recordings import store
    from harness.results import findings
    from harness.run import coverage

    s = sessions.start("test_capabilities:NoDiffKV", ["0.25.1"], store.ROOT, tmp_path, tmp_path / "kept",
                       findings.DIRECTORY, "cpu", "test", "")
    line = coverage.coverage(s)[0]
    assert ("2 geometries (packed-tokens:B.N.H.C+diffkv, packed-tokens:B.H.N.C+diffkv): unsupported, by its "
            "supports_layer: V's head size unlike K's") in line, line
