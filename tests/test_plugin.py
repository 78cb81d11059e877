"""kvconform as another project uses it: the pytest plugin (entry point `kvconform`) runs kvconform.suites against
the project's own subject from a throwaway project directory, with prefixed options, and stays inert otherwise."""

import json
import os
import re
from pathlib import Path

import pytest

from harness.device import devices
from harness.recordings import store

pytest_plugins = ["pytester"]

HOST_SUBJECT = '''
"""A host project's subject: plain torch attention over the K/V its split hands it (no Triton, so quick on a CPU)."""
import torch

from harness.handed.cache import read
from harness.handed.layer import kv_views
from harness.subjects import TileConfig


class Correct:
    name = "host-correct"

    def supports(self, case):
        return None if case.sparsity.mode == "none" else "dense attention only"

    def split(self, kv_cache, layer):
        return kv_views(kv_cache, layer)

    def tile_config(self, case):
        return TileConfig(16, 16)

    def paged_forward(self, case, q, k_cache, v_cache, paging, tile):
        k, v = read(k_cache, v_cache, paging)
        return self.dense_forward(case, q, k, v, tile)

    def dense_forward(self, case, q, k, v, tile):
        out, q0, k0 = torch.empty_like(q), 0, 0
        group = case.num_heads // case.kv_heads
        for ql, kl in zip(case.q_lens, case.kv_lens):
            qs = q[q0:q0 + ql].float().transpose(0, 1)
            ks = k[k0:k0 + kl].float().repeat_interleave(group, 1).transpose(0, 1)
            vs = v[k0:k0 + kl].float().repeat_interleave(group, 1).transpose(0, 1)
            s = qs @ ks.transpose(1, 2) * case.scale
            if case.causal:
                later = torch.arange(kl)[None, :] > (kl - ql + torch.arange(ql))[:, None]
                s = s.masked_fill(later, float("-inf"))
            out[q0:q0 + ql] = (s.softmax(-1) @ vs).transpose(0, 1).to(q.dtype)
            q0, k0 = q0 + ql, k0 + kl
        return out


class Unbinds(Correct):
    """What an RL framework did: K and V are kv_cache[0] and kv_cache[1], whatever the release."""

    name = "host-unbinds"

    def split(self, kv_cache, layer):
        kv_views(kv_cache, layer)  # the same shape checks as Correct: a malformed cache is refused alike
        k, v, *_ = kv_cache.unbind(0)
        return k, v
'''
FAMILIES = ("0.22.1", "0.25.1", "0.33.0")  # kv-first, blocks-first, packed
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def host(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(host_subject=HOST_SUBJECT)
    pytester.makepyfile(test_own="def test_own_thing():\n    assert 1 + 1 == 2\n")  # the project's own tests
    return pytester


def _suites(host: pytest.Pytester, subject: str, *args: str):
    releases = [f"--kvconform-release={r}" for r in FAMILIES] + [  # FlashAttention's family of each era
        "--kvconform-backend=FLASH_ATTN", "--kvconform-cache-dtype=auto"]
    return host.runpytest_subprocess("--pyargs", "kvconform.suites", "-p", "no:cacheprovider", "-q", "-rA",
                                     f"--kvconform-subject=host_subject:{subject}", *releases,
                                     "--hypothesis-profile=kvconform-ci", "--kvconform-max-examples=2",
                                     "-k", "split or bit_identity", *args)


def _outcomes(out: str) -> dict[str, str]:
    """item -> PASSED / FAILED / ... from the -rA summary."""
    return {item: word for word, item in re.findall(r"^(PASSED|FAILED|XFAIL|ERROR) \S*::(\S+)", out, re.M)}


def test_a_correct_subject_passes_on_every_family(host):
    done = _suites(host, "Correct")
    out = done.stdout.str()
    assert done.ret == 0, out[-3000:]
    got = _outcomes(out)
    assert got and set(got.values()) == {"PASSED"}, out[-3000:]
    assert {r for item in got for r in FAMILIES if f"[{r}-" in item} == set(FAMILIES)
    assert (host.path / "results" / "0.33.0" / "results.jsonl").is_file()  # results land in the host project
    # The summary's cost of each check counts the examples its result lines record, and names its phases.
    lines = [json.loads(x) for r in FAMILIES
             for x in (host.path / "results" / r / "results.jsonl").read_text().splitlines()]
    # Each line names the vLLM build its recording was probed from (the version alone where the recording kept no
    # more), as the recording itself says.
    for r in FAMILIES:
        seen = store.load(r).observations
        want = seen.get("build") or {"version": seen["installed"], "commit": "", "wheel": "", "index": ""}
        assert {json.dumps(x["build"], sort_keys=True) for x in lines if x["release"] == r} == {
            json.dumps(want, sort_keys=True)}, r
    # Under -q (pytest prints no header) the run's header lines come first all the same, once.
    assert out.count("kvconform release 0.33.0: replay of the recorded fixture") == 1, out[:3000]
    assert re.search(r"^kvconform 0\.22\.1: host-correct selects .* not checked", out, re.M), out[:3000]
    for check in ("split-agrees", "bit-identity"):
        cost = re.search(rf"^kvconform cost {check}: (\d+) examples, [\d.]+ s, [\d.]+ ms/example \((.+)\)$", out,
                         re.M)
        assert cost, out[-3000:]
        assert int(cost.group(1)) == sum(x["check"] == check and x["case"] != "" for x in lines)
        assert "draw" in cost.group(2) and "subject" in cost.group(2)


def test_a_subject_that_unbinds_axis_0_fails_exactly_on_blocks_first_and_packed(host):
    done = _suites(host, "Unbinds")
    out = done.stdout.str()
    assert done.ret == 1, out[-3000:]
    got = _outcomes(out)
    failed = {item for item, word in got.items() if word == "FAILED"}
    # (0.33.0's model layers at an offset are handed packed views too: harness.run.targets.InModel)
    assert failed and all(("[0.25.1-blocks-first" in i or "[0.33.0-packed" in i or "[0.33.0-model:" in i)
                          for i in failed), got
    assert all(word == "PASSED" for item, word in got.items() if "[0.22.1-" in item), got
    # Every blocks-first and packed split-agrees item fails; the kernel checks there are not run, not passed.
    split_items = [i for i in got if i.startswith("test_split_agrees[") and "0.22.1" not in i]
    assert split_items and all(got[i] == "FAILED" for i in split_items), got
    repros = re.findall(r"REPRO (\S+) release=(\S+)", out)
    assert repros and {r for _, r in repros} == {"0.25.1", "0.33.0"}, out[-3000:]
    assert "harness-error" not in out  # what the subject returned is the subject's outcome
    kept = list((host.path / "results" / "regressions" / "host-unbinds").glob("split-agrees-*.json"))
    assert kept  # shrunk examples are kept in the host project, replayed by its next run


REGISTERED_NOTHING = """
import os
import sys

import pytest
from hypothesis import settings
from hypothesis.errors import InvalidArgument


def test_kvconform_registered_nothing(request):
    pm = request.config.pluginmanager
    module = pm.get_plugin("kvconform")
    assert module is not None  # installed, so loaded through its entry point
    assert sorted(h.name for h in pm.get_hookcallers(module)) == ["pytest_addoption", "pytest_cmdline_main"]
    assert pm.get_plugin("kvconform-run") is None
    assert not [p for p in pm.get_plugins() if type(p).__name__ == "KvconformPlugin"]
    for name in ("kvconform-dev", "kvconform-ci", "kvconform-gpu", "kvconform-nightly"):
        with pytest.raises(InvalidArgument):
            settings.get_profile(name)
    with pytest.raises(pytest.FixtureLookupError):
        request.getfixturevalue("conformance")
    # The options' defaults: the limits module and the package it lies in.
    assert [m for m in sys.modules if m.startswith("harness.")] == ["harness.device", "harness.device.limits"]
    assert {k: v for k, v in os.environ.items() if k.startswith("TRITON")} == TRITON_BEFORE
"""


def test_a_plain_run_registers_nothing_of_kvconform(host):
    triton = {k: v for k, v in os.environ.items() if k.startswith("TRITON")}
    host.makepyfile(test_plain=f"TRITON_BEFORE = {triton!r}\n" + REGISTERED_NOTHING)
    done = host.runpytest_subprocess("-p", "no:cacheprovider", "-q", "test_own.py", "test_plain.py")
    done.assert_outcomes(passed=2)
    assert not (host.path / "results").exists()
    assert "kvconform" not in done.stdout.str()


def test_an_inherited_xdist_worker_variable_does_not_make_a_worker(host, monkeypatch):
    # A process started from inside an xdist worker inherits PYTEST_XDIST_WORKER; only xdist's worker input makes
    # a process a worker, so this run is its own controller and says its summary.
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "-p", "no:cacheprovider", "-q",
                                     "--kvconform-release=0.33.0", "-k", "contracts")
    out = done.stdout.str()
    assert done.ret == 0, out[-3000:]
    assert re.search(r"^kvconform run \S+$", out, re.M), out[-3000:]
    assert re.search(r"^kvconform process main on cpu: 2 results", out, re.M), out[-3000:]


def test_help_lists_the_prefixed_options_without_vllm(host):
    done = host.runpytest_subprocess("--help")
    out = done.stdout.str()
    assert done.ret == 0
    for option in ("--kvconform-release", "--kvconform-subject", "--kvconform-max-examples",
                   "--kvconform-regressions-dir", "--kvconform-workers-per-gpu"):
        assert option in out


@pytest.mark.parametrize("subject, says", [
    ("nope", "unknown subject 'nope'"),
    ("os:path", "subject 'os:path': os.path is not a class"),
    ("no_such_module:Thing", "cannot import module 'no_such_module'"),
    ("raises_on_import:Thing", "subject 'raises_on_import:Thing': importing module 'raises_on_import' raised "
                               "RuntimeError: no GPU library here ("),
])
def test_a_bad_subject_is_a_one_line_usage_error(host, subject, says):
    host.makepyfile(raises_on_import="import os\n\nraise RuntimeError('no GPU library here')\n")
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "--kvconform-release=0.33.0",
                                     f"--kvconform-subject={subject}")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    err = done.stderr.str()
    assert says in err and "Traceback" not in err and "INTERNALERROR" not in err, err
    if subject.startswith("raises"):
        assert "raises_on_import.py:3)" in err, err  # the file and line that raised


@pytest.mark.parametrize("args, env, says", [
    (("--hypothesis-profile=kvconform-fast",), {}, "--hypothesis-profile=kvconform-fast: no such profile; "
                                                   "kvconform's: kvconform-dev, kvconform-ci, kvconform-find"),
    ((), {"KVCONFORM_PROFILE": "fast"}, "KVCONFORM_PROFILE=fast: no such profile; kvconform's: dev, ci, find"),
])
def test_an_unknown_profile_is_a_one_line_usage_error_naming_the_known_ones(host, monkeypatch, args, env, says):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "--kvconform-release=0.33.0", *args)
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    err = done.stderr.str()
    assert says in err and "Traceback" not in err and "INTERNALERROR" not in err, err


@pytest.mark.parametrize("args, says", [
    (("--kvconform-max-examples=-5",), "--kvconform-max-examples=-5: takes a whole number >= 1"),
    (("--kvconform-timeout=-1",), "--kvconform-timeout=-1: takes seconds >= 0 (0: no limit)"),
    (("--kvconform-cache-dtype=fp9",), "fp9"),
    (("--kvconform-backend=NOPE",), "backend(s) NOPE not among"),
])
def test_a_bad_option_value_is_a_one_line_usage_error(host, args, says):
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "--kvconform-release=0.33.0", *args)
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    err = done.stderr.str()
    assert says in err and "Traceback" not in err and "INTERNALERROR" not in err, err


def test_bad_recordings_and_known_findings_are_one_line_usage_errors_naming_the_file(host):
    contracts, known = host.mkdir("contracts"), host.mkdir("known")
    (contracts / "0.20.0.json").write_text('{"release": "0.20.0", "contr')
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "--kvconform-release=0.20.0",
                                     f"--kvconform-contracts-dir={contracts}")
    err = done.stderr.str()
    assert done.ret == pytest.ExitCode.USAGE_ERROR and f"{contracts / '0.20.0.json'}:1:" in err, err
    assert "Traceback" not in err and "INTERNALERROR" not in err, err
    (contracts / "0.20.0.json").write_text("{}")
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "--kvconform-release=0.20.0",
                                     f"--kvconform-contracts-dir={contracts}")
    err = done.stderr.str()
    assert done.ret == pytest.ExitCode.USAGE_ERROR, err
    assert f"{contracts / '0.20.0.json'}: not a recording: an empty JSON object, not an object with the fields " \
           "release, contracts, observations and api" in err and "Traceback" not in err, err
    (known / "builtin.toml").write_text("[[finding]]\nreleases = '*'\n")
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "--kvconform-release=0.33.0",
                                     f"--kvconform-known-findings={known}")
    err = done.stderr.str()
    assert done.ret == pytest.ExitCode.USAGE_ERROR and f"{known / 'builtin.toml'} finding 1: keys" in err, err


def test_the_summary_speaks_of_this_run_only(host):
    # An earlier run left results of both releases; this run deselects every check of 0.22.1 by -k.
    assert _suites(host, "Correct").ret == 0
    done = _suites(host, "Correct", "-k", "not 0.22.1")
    out = done.stdout.str()
    run = re.search(r"^kvconform run (\S+)$", out, re.M).group(1)
    assert re.search(r"^kvconform 0\.22\.1 \(replay\) host-correct: not run \(this run checked nothing of it",
                     out, re.M), out[-3000:]
    assert re.search(r"^kvconform 0\.25\.1 \(replay\) host-correct: \d+ bit-identical", out, re.M), out[-3000:]
    lines = (host.path / "results" / "0.25.1" / "results.jsonl").read_text().splitlines()
    assert lines and all(f'"run": "{run}"' in line for line in lines)
    slowest = re.search(r"^kvconform slowest bit-identity: (.+)$", out, re.M)
    assert slowest and "0.22.1" not in slowest.group(1), out[-3000:]


def test_no_release_without_vllm_is_a_usage_error_naming_the_recordings(host):
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites")
    assert done.ret == pytest.ExitCode.USAGE_ERROR
    assert "name the release(s) to replay with --kvconform-release" in done.stderr.str()


REPORTS_XDIST = '''
import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):  # after xdist's: what it made of -n, then stop before any session starts
    print("XDIST", config.option.numprocesses, config.option.dist, len(getattr(config.option, "tx", None) or []))
    pytest.exit("configured", 0)
'''


REPORTS_BLAS = '''
import os
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):  # after every pytest_configure, before xdist starts its workers
    print("BLAS", os.environ.get("OPENBLAS_NUM_THREADS"))
    pytest.exit("configured", 0)
'''


@pytest.mark.parametrize("args, env, want", [(("-n", "2"), None, f"BLAS {devices.cpu_share(2)}"),
                                             (("-n", "2"), "3", "BLAS 3"), (("-n", "0"), None, "BLAS None")])
def test_workers_get_their_share_of_the_cpus_for_numpys_blas(host, monkeypatch, args, env, want):
    # Workers inherit the variable from the process that starts them; a value the user set is kept.
    if env is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", env)
    host.makepyfile(reports_blas=REPORTS_BLAS)
    done = host.runpytest_subprocess("-p", "kvconform", "-p", "reports_blas", "--pyargs", "kvconform.suites",
                                     "--kvconform-release=0.33.0", "-p", "no:cacheprovider", *args)
    assert want in done.stdout.str(), done.stdout.str()[-2000:]


@pytest.mark.parametrize("args, want", [((), "XDIST 6 load 6"), (("-n", "0"), "XDIST 0 no 0"),
                                        (("-n", "1"), "XDIST 1 load 1")])
def test_on_gpus_no_n_means_workers_per_gpu_and_xdist_starts_them(host, args, want):
    # The worker count must be set before xdist's own pytest_cmdline_main turns -n into its worker list, also when
    # kvconform is loaded before xdist (`-p kvconform`, as this repository's pyproject does).
    host.makeconftest("import harness.device.devices, torch\nharness.device.devices.gpus = lambda: 2  # two GPUs\n"
                      "torch.cuda.set_device = lambda device: None\n")
    host.makepyfile(reports_xdist=REPORTS_XDIST)
    done = host.runpytest_subprocess("-p", "kvconform", "-p", "reports_xdist", "--pyargs", "kvconform.suites",
                                     "--kvconform-release=0.33.0", "--kvconform-workers-per-gpu=3",
                                     "-p", "no:cacheprovider", *args)
    assert want in done.stdout.str(), done.stdout.str()[-2000:]


OWN_SUBJECTS = '''
"""A host project's connector (the example block mover), a reader that raises and one that reads nothing."""
from block_mover import BlockMover
from harness.handed.layer import kv_views


class Connector(BlockMover):
    name = "host-connector"


class Raises:
    name = "host-raises"
    capabilities = frozenset({"split"})

    def split(self, kv_cache, layer):
        return self.halves(kv_cache)

    def halves(self, kv_cache):
        raise ValueError(f"cannot halve {tuple(kv_cache.shape)}")


class ReadsNothing:
    name = "host-reads-nothing"
    capabilities = frozenset({"split"})

    def supports_layer(self, layer):
        return "this reader is not written yet"

    def split(self, kv_cache, layer):
        return kv_views(kv_cache, layer)
'''


def _own_subjects(host: pytest.Pytester) -> None:
    host.makepyfile(own_subjects=OWN_SUBJECTS, block_mover=(REPO / "examples" / "block_mover.py").read_text())


def test_a_connectors_header_says_nothing_of_geometries_it_is_never_handed(host):
    """A subject declaring only `connector` takes no check of one geometry's cache: its header names, per release,
    the models it checks, never the latent, NVFP4 or other geometries the K/V checks leave out."""
    _own_subjects(host)
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "-p", "no:cacheprovider", "--co",
                                     "--kvconform-subject=own_subjects:Connector", "--kvconform-release=0.8.5.post1",
                                     "--kvconform-release=0.22.1", "--kvconform-release=0.33.0")
    out = done.stdout.str()
    assert done.ret == 0, out[-3000:]
    header = [line for line in out.split("rootdir:")[0].splitlines() if line.startswith("kvconform")]
    assert not [line for line in header if re.search(r"latent|nvfp4|contracts in|a K/V subject", line)], header
    assert re.search(r"^kvconform 0\.22\.1 \(replay\): host-connector checks \d+ models \(uniform, ", out, re.M), header
    assert re.search(r"^kvconform 0\.8\.5\.post1 \(replay\): host-connector checks nothing: the whole-model "
                     "allocation was not read", out, re.M), header
    assert len(header) == 2 + 3 + 1, header  # subject and examples, a line per release, the checks it lacks


def test_a_new_findings_traceback_is_the_subjects_frames_and_the_verdict(host):
    """What the subject raised shows from its own frames; then the suite's line and kvconform's verdict. The
    harness's and hypothesis' frames in between show under --full-trace only."""
    _own_subjects(host)
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "-p", "no:cacheprovider",
                                     "--kvconform-subject=own_subjects:Raises", "--kvconform-release=0.22.1",
                                     "--kvconform-backend=FLASH_ATTN", "--kvconform-cache-dtype=auto",
                                     "--kvconform-max-examples=2", "-k", "split_agrees and not regression")
    out = done.stdout.str()
    assert done.ret == 1, out[-3000:]
    first = out.split("= FAILURES =")[1].split("\n___")[1]  # the first failure, in full
    assert re.search(r"own_subjects\.py:\d+: in split\n(.*\n)+?own_subjects\.py:\d+: in halves\n", first), first
    assert "E   ValueError: cannot halve" in first and "NewFinding: subject-error: ValueError" in first, first
    assert re.search(r"test_split\.py:\d+: in test_split_agrees\n", first), first
    assert not re.search(r"harness/|hypothesis/|kvconform/__init__\.py", first), first
    assert len(first.splitlines()) < 60, first


def test_skip_reasons_show_in_a_host_project_without_r(host):
    """A host project has no -ra of kvconform's own pyproject: a skipped item's reason (what was not checked) is
    listed all the same."""
    _own_subjects(host)
    done = host.runpytest_subprocess("--pyargs", "kvconform.suites", "-p", "no:cacheprovider",
                                     "--kvconform-subject=own_subjects:ReadsNothing", "--kvconform-release=0.22.1",
                                     "--kvconform-max-examples=2", "-k", "split_agrees and not regression")
    out = done.stdout.str()
    assert done.ret == 0, out[-3000:]
    assert re.search(r"^SKIPPED \[\d+\] .*host-reads-nothing supports none of the examples: this reader is not "
                     "written yet", out, re.M), out[-3000:]
