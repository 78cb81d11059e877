"""The transfer check (conformance/test_transfer.py) over the example offloaders of examples/: the correct one
passes on every geometry of one release per family; the one that detects the layout by `kv_cache.shape[0] == 2` is
caught exactly where it is wrong (blocks-first, num_blocks 2), through the runner and through the pytest plugin in
a throwaway host project; deliberately broken transfers fail."""

import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import settings  # noqa: E402

from harness import checks, contract  # noqa: E402
from harness.checks import transfer  # noqa: E402
from harness.draws import profiles, strategies
from harness.handed.layer import kv_views  # noqa: E402
from harness.recordings import store
from harness.results import (
    Word,  # noqa: E402
    findings,
)
from harness.run import implementation, loop, trial  # noqa: E402
from harness.run import session as sessions

pytest_plugins = ["pytester"]
profiles.register()
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FAMILIES = ("0.22.1", "0.25.1", "0.33.0")  # kv-first, blocks-first, packed
sys.path.insert(0, str(EXAMPLES))
import offloader  # noqa: E402


class SpillsOnAPage(offloader.Offloader):
    """Injects correctly, then also writes the last page of the target (a spare page no block maps to)."""

    name = "spills"

    def inject(self, kv_cache, layer, block_ids, payload):
        super().inject(kv_cache, layer, block_ids, payload)
        k, _ = kv_views(kv_cache, layer)
        spare = [b for b in range(k.shape[0]) if b not in block_ids.tolist()]
        if spare:
            k[spare[-1]] = 0


class KeepsViews(offloader.Offloader):
    """Its payload aliases the source blocks (no copy): whatever reuses them is what it injects."""

    name = "keeps-views"

    def extract(self, kv_cache, layer, block_ids):
        k, v = self.split(kv_cache, layer)
        return [(k, v), block_ids]

    def inject(self, kv_cache, layer, block_ids, payload):
        (k, v), ids = payload
        super().inject(kv_cache, layer, block_ids, torch.stack([k[ids], v[ids]]))


class WritesNothing(offloader.Offloader):
    """Takes the payload and writes it nowhere."""

    name = "writes-nothing"

    def inject(self, kv_cache, layer, block_ids, payload):
        pass


class Raises(offloader.Offloader):
    name = "raises"

    def inject(self, kv_cache, layer, block_ids, payload):
        raise RuntimeError("connector closed")


@pytest.fixture
def session(tmp_path):
    before = settings.get_current_profile_name()
    settings.load_profile("kvconform-ci")

    def start(subject):
        s = sessions.start(subject if isinstance(subject, str) else "offloader:Offloader", list(FAMILIES),
                         store.ROOT, tmp_path / "results", tmp_path / "regressions",
                         findings.DIRECTORY, "cpu", "test-main", "", ("FLASH_ATTN",), ("auto",))
        return s if isinstance(subject, str) else dataclasses.replace(s, subject=subject, subject_name=subject.name)

    yield start
    settings.load_profile(before)


def _check(s, t, ex, seed):
    return transfer.IMPLEMENTATION.body(loop.Loop(s, "pytest x").trial(t, checks.TRANSFER.name, ex, seed))


def _grid(s):
    """Every geometry of the three releases at num_blocks 2, 3 and 5: the outcome of each explicit example."""
    out = {}
    for t in implementation.targets(s):
        for blocks in (2, 3, 5):
            for ex, seed in transfer.explicit(t.contract, s.sizes):
                if ex.case.blocks_needed() <= blocks:
                    out[(t.release.release, t.geometry, blocks, ex.case.kv_lens)] = _check(
                        s, t, dataclasses.replace(ex, num_blocks=blocks), seed)
    return out


def test_block_ids_move_every_block_to_another_one():
    for blocks in (2, 3, 7):
        for seed in range(30):
            ex = transfer.explicit(contract.Contract.of(("KV", "B", "N", "H", "D"), ("KV", "B", "N", "H", "D")),
                                   strategies.CPU)[0][0]
            ex = dataclasses.replace(ex, num_blocks=blocks, page_seed=seed)
            src, dst = transfer.block_ids(ex.paging(), blocks, seed)
            assert src and len(set(dst)) == len(dst) and all(s != d for s, d in zip(src, dst))
            assert all(0 <= d < blocks for d in dst)


def test_the_explicit_examples_are_two_and_three_pages_on_every_geometry(session):
    s = session("offloader:Offloader")
    for t in implementation.targets(s):
        got = [(ex.num_blocks, ex.case.blocks_needed()) for ex, _ in transfer.explicit(t.contract, s.sizes)]
        assert got == [(2, 2), (3, 1)]


def test_the_correct_offloader_moves_blocks_exactly_on_every_geometry(session):
    got = _grid(session("offloader:Offloader"))
    assert got and {o.word for o in got.values()} == {Word.BIT_IDENTICAL}


def test_shape_sniffing_is_wrong_exactly_on_blocks_first_with_two_blocks(session):
    got = _grid(session("offloader:ShapeSniffingReader"))
    wrong = {k for k, o in got.items() if o.word != Word.BIT_IDENTICAL}
    assert wrong == {k for k in got if k[1].startswith("blocks-first") and k[2] == 2}, wrong
    assert {got[k].word for k in wrong} == {Word.DIFFERS}
    assert {k[0] for k in wrong} == {"0.25.1"} and len({k[1] for k in wrong}) == 4  # all four blocks-first orders


def test_the_runner_catches_shape_sniffing_with_a_repro_at_two_blocks_and_passes_the_rest(session):
    s = session("offloader:ShapeSniffingReader")
    caught = {}
    for t in implementation.targets(s):
        r = loop.Loop(s, "pytest conformance/test_transfer.py::test_transfer_regression", 1)
        try:
            r.run(t, checks.TRANSFER)
        except loop.NewFinding as e:
            caught[t.geometry, t.release.release] = str(e).splitlines()[-1]
    assert {g for g, _ in caught} == {t.geometry for t in implementation.targets(s)
                                      if t.contract.layout.family == "blocks-first"}
    for repro in caught.values():
        assert repro.startswith("REPRO transfer release=0.25.1 (replay) geometry=blocks-first:")
        assert " num_blocks=2 " in repro
    kept = list((s.regressions_dir / s.subject_name).glob("transfer-*.json"))
    assert len(kept) == len(caught)


@pytest.mark.parametrize("subject, says", [
    (SpillsOnAPage(), "outside the K/V of blocks"),
    (KeepsViews(), "still the poison it was allocated with"),
    (WritesNothing(), "still the poison it was allocated with: inject wrote nothing"),
])
def test_a_broken_transfer_differs(session, subject, says):
    s = session(subject)
    got = _grid(s)
    # Where both pages of a 2-page cache move, no page is spare for SpillsOnAPage to spill on.
    full = {k for k in got if k[2] == 2 and k[3][0] > 1} if isinstance(subject, SpillsOnAPage) else set()
    wrong = {k: o for k, o in got.items() if k not in full}
    assert wrong and {o.word for o in wrong.values()} == {Word.DIFFERS}
    assert all(says in o.diagnosis for o in wrong.values()), {o.diagnosis for o in wrong.values()}
    assert all(got[k].word is Word.BIT_IDENTICAL for k in full)


def test_what_the_subject_raises_is_a_subject_error(session):
    s = session(Raises())
    t = implementation.targets(s)[0]
    ex, seed = transfer.explicit(t.contract, s.sizes)[0]
    with pytest.raises(trial.Verdict) as e:
        _check(s, t, ex, seed)
    assert e.value.outcome.word is Word.SUBJECT_ERROR and "connector closed" in e.value.outcome.diagnosis


# ---- through the plugin, in a throwaway host project --------------------------------------------------------------


def _outcomes(out: str) -> dict[str, str]:
    return {item: word for word, item in re.findall(r"^(PASSED|FAILED|XFAIL|ERROR) \S*::(\S+)", out, re.M)}


def test_the_plugin_catches_the_shape_sniffing_offloader_only_on_blocks_first(pytester):
    pytester.makepyfile(offloader=(EXAMPLES / "offloader.py").read_text())
    done = pytester.runpytest_subprocess(
        "--pyargs", "kvconform.suites", "-p", "no:cacheprovider", "-q", "-rA",
        "--kvconform-subject=offloader:ShapeSniffingReader", *[f"--kvconform-release={r}" for r in FAMILIES],
        "--kvconform-backend=FLASH_ATTN", "--kvconform-cache-dtype=auto",
        "--hypothesis-profile=kvconform-ci", "--kvconform-max-examples=1", "-k", "transfer or bit_identity")
    out = done.stdout.str()
    assert done.ret == 1, out[-3000:]
    got = _outcomes(out)
    failed = {i for i, w in got.items() if w == "FAILED"}
    assert failed == {i for i in got if "[0.25.1-blocks-first" in i} and len(failed) == 4, got
    # and the FLASH_ATTN model layers handed views no geometry has: 0.22.1's hybrid one, four of 0.33.0 at an offset
    assert all(w == "PASSED" for i, w in got.items() if i not in failed) and len(got) == 4 + 4 + 9 + 1 + 4, got
    assert not any("bit_identity" in i for i in got)  # needs forwards: not generated for an offloader
    repros = re.findall(r"REPRO transfer release=(\S+) \(replay\) geometry=(\S+) .* num_blocks=(\d+) ", out)
    assert repros and {(r, n) for r, _, n in repros} == {("0.25.1", "2")}, out[-3000:]
    assert "harness-error" not in out
