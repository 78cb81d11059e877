"""Compiles are bounded and counted: the built-in kernel specialises on its declared constexprs and dtypes only,
the warm-up cases span every variant an example can draw, and the cache layer counts compiles and loads apart."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import checks
from harness.contract import cache_dtype, families
from harness.device import compiles
from harness.draws.cases import Case
from harness.draws.strategies import CPU, GPU, examples, warmup_shards
from harness.recordings import store
from harness.results import findings
from harness.run import implementation, warmup
from harness.run import session as sessions
from harness.run import targets as targeting
from harness.subjects import builtin, load_subject
from harness.subjects.builtin import BuiltinSubject

REPO = Path(__file__).resolve().parent.parent
SUBJECT = BuiltinSubject()
FLOATS = {"scale_log2", "log2_threshold"}  # fp32 arguments: Triton never specialises on their values


def test_every_runtime_integer_of_the_kernels_is_left_unspecialised():
    # Outside the interpreter (a JITFunction knows its parameters' specialisation; building one needs no GPU).
    script = ("import json\nfrom harness.subjects import builtin\n"
              "print(json.dumps({k.__name__: [(p.name, p.is_constexpr, p.do_not_specialize) for p in k.params]"
              " for k in (builtin._attn_fwd, builtin._combine)}))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for kernel, params in json.loads(done.stdout).items():
        runtime_ints = {name for name, constexpr, _ in params
                        if not constexpr and not name.endswith("_ptr") and name not in FLOATS}
        unspecialised = {name for name, _, dns in params if dns}
        assert runtime_ints and runtime_ints == unspecialised, (kernel, runtime_ints ^ unspecialised)


class Launches:
    """Stands in for the built-in's kernels: each launch is recorded by what it compiles (compiles.launch_key),
    nothing runs."""

    def __init__(self, kernel):
        self.kernel, self.keys = kernel, set()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.keys.add(compiles.launch_key(self.kernel, args, kwargs))


@pytest.fixture(scope="module")
def launches():
    """The launch keys of the built-in's forwards over meta tensors (GPU-sized batches cost nothing there)."""
    kernels = {name: Launches(getattr(builtin, name)) for name in ("_attn_fwd", "_combine")}
    with pytest.MonkeyPatch.context() as mp:
        for name, fake in kernels.items():
            mp.setattr(builtin, name, fake)

        def keys(case, contract, dims, pages) -> frozenset:
            for fake in kernels.values():
                fake.keys = set()
            rows = lambda n, h: torch.empty(n, h, case.head_dim, dtype=case.torch_dtype, device="meta")  # noqa: E731
            q, k = rows(sum(case.q_lens), case.num_heads), rows(sum(case.kv_lens), case.kv_heads)
            compiles.forwards(SUBJECT, case, contract, dims, pages, q, k, torch.empty_like(k))
            return frozenset().union(*(fake.keys for fake in kernels.values()))

        yield keys


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A session over every recording (every backend and cache dtype): what the warm-up and the examples meet."""
    d = tmp_path_factory.mktemp("session")
    return sessions.start("builtin", ["recorded"], store.ROOT, d, d, findings.DIRECTORY, "cpu", "test", "")


@pytest.fixture(scope="module")
def warmed(session, launches):
    """What the session warm-up compiles, per device's sizes: the launches of its cases in its geometries."""
    contracts = warmup.warm_contracts(session)
    return {sizes: frozenset().union(*(launches(case, contract, *compiles.warm_paging(case))
                                       for shard in warmup_shards(SIZES[sizes]) for case in shard
                                       if SUBJECT.supports(case) is None
                                       for contract in contracts))
            for sizes in SIZES}


@pytest.fixture(scope="module")
def read(session):
    """Every geometry of every recording the subject reads, as the forward checks take them."""
    return [t.contract for t in targeting.geometries(session, kernels=True)
            if session.supports(t.release, t.contract) is None]


SIZES = {"gpu": GPU, "cpu": CPU}


def test_the_warm_up_covers_every_cache_dtype_the_subject_reads(session):
    read = {t.contract.cache_dtype for t in targeting.geometries(session, kernels=True)
            if session.supports(t.release, t.contract) is None}
    assert len(read) > 1 and {c.cache_dtype for c in warmup.warm_contracts(session)} <= read
    assert {c.dtype.view for c in warmup.warm_contracts(session)} == {
        t.contract.dtype.view for t in targeting.geometries(session, kernels=True) if t.contract.cache_dtype in read}


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), sizes=st.sampled_from(sorted(SIZES)))
def test_the_warm_up_compiles_every_variant_drawn_examples_launch(read, launches, warmed, data, sizes):
    # Examples as the forward checks draw them, over every geometry of every recording the subject reads; what
    # their launches compile must be among what the warm-up's launches compiled.
    ex = data.draw(examples(read, SIZES[sizes]))
    if SUBJECT.supports(ex.case) is not None:
        return
    new = launches(ex.case, ex.contract, ex.dims, ex.paging()) - warmed[sizes]
    assert not new, (ex.case, ex.contract.name, sorted(new))


@pytest.mark.parametrize("sizes", sorted(SIZES))
def test_the_warm_up_compiles_every_variant_the_explicit_examples_launch(session, launches, warmed, sizes):
    # The ambiguous examples every forward check runs first, in each geometry of every recording the subject reads.
    targets = {t.contract.name: t for t in targeting.geometries(session, kernels=True)
               if session.supports(t.release, t.contract) is None}
    ran = 0
    for check in (c for c in checks.CHECKS if c.kernels):
        for target in targets.values():
            contract = target.contract
            for ex, _ in implementation.of(check).explicit(target, SIZES[sizes]):
                assert SUBJECT.supports(ex.case) is None, ex.case
                new = launches(ex.case, ex.contract, ex.dims, ex.paging()) - warmed[sizes]
                assert not new, (check.name, ex.case, contract.name, sorted(new))
                ran += 1
    assert ran >= 2 * 2 * len(targets)


def test_a_launch_key_tells_apart_what_triton_compiles_apart(launches):
    case = Case((1,), (40,), 2, 1, 64, 16)
    contract = families()[0]
    model = launches(case, contract, *compiles.warm_paging(case))
    fp8 = launches(case, dataclasses.replace(contract, dtype=cache_dtype("fp8_e4m3")), *compiles.warm_paging(case))
    longer = launches(dataclasses.replace(case, kv_lens=(4000,)), contract, *compiles.warm_paging(
        dataclasses.replace(case, kv_lens=(4000,))))
    assert model != fp8  # the K/V pointers' element type
    assert model != longer  # split-KV: another constexpr and the combine kernel
    assert launches(dataclasses.replace(case, kv_lens=(41,)), contract,
                    *compiles.warm_paging(dataclasses.replace(case, kv_lens=(41,)))) == model  # a runtime length


def test_the_warm_up_is_small(warmed):
    # A few hundred compiles on the GPU sizes, about 200 per K/V element type the recordings hand the built-in (the
    # model dtype, fp8 e4m3, fp8 e5m2): seconds each, so a session warm-up spread over 16 processes is a minute or two.
    assert len(warmed["gpu"]) <= 650, len(warmed["gpu"])


def test_the_cache_layer_counts_compiles_and_loads_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    before = compiles.counts()
    manager = compiles.CountingCacheManager("k" * 8)
    assert manager.get_group("kernel.json") is None  # a miss is neither
    path = manager.put("{}", "kernel.json", binary=False)
    manager.put_group("kernel.json", {"kernel.json": path})  # what a compile stores
    manager.put_group("launcher.so", {})  # not a kernel
    assert manager.get_group("kernel.json") == {"kernel.json": path}  # what a later load finds
    assert compiles.counts() == compiles.Counts(before.compiled + 1, before.loaded + 1)


def small_shards(shards: int, cases: int) -> list[list[Case]]:
    """The first cases of the first CPU warm-up shards, at one short sequence (the interpreter is slow)."""
    return [[dataclasses.replace(c, q_lens=(1,), kv_lens=(16,)) for c in shard[:cases]]
            for shard in warmup_shards(CPU)[:shards]]


def test_the_warm_up_runs_the_subject_in_parallel_processes():
    # On the CPU nothing compiles (the interpreter), but every case must run through both forwards without error.
    shards = small_shards(4, 2)
    done = compiles.warm("builtin", shards, [families()[4]], ["cpu"], 2)
    assert done.errors == () and done.cases == sum(map(len, shards)) and done.processes == 2
    assert done.counts == compiles.Counts(0, 0)


def test_a_warm_up_job_counts_what_it_compiled_not_what_its_process_did_before(monkeypatch):
    # A pool process runs many jobs: summing its running totals counted its first job's compiles again in each one.
    monkeypatch.setitem(compiles._counts, "compiled", 7)
    monkeypatch.setitem(compiles._counts, "loaded", 3)
    counts, errors = compiles._warm_shard(("builtin", small_shards(1, 1)[0], families()[4], "cpu"))
    assert errors == [] and counts == compiles.Counts(0, 0)


def test_a_finished_warm_up_is_not_repeated_in_the_same_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(compiles.triton.knobs.cache, "dir", str(tmp_path))
    shards = small_shards(2, 1)
    subject = load_subject("builtin")
    key = compiles.fingerprint(subject, shards, [families()[4]], ["cpu"])
    assert key != compiles.fingerprint(subject, shards[:1], [families()[4]], ["cpu"])  # other cases, another warm-up
    fp8 = dataclasses.replace(families()[4], dtype=cache_dtype("fp8_e4m3"))
    assert key != compiles.fingerprint(subject, shards, [families()[4], fp8], ["cpu"])  # another K/V type
    first = compiles.warm("builtin", shards, [families()[4]], ["cpu"], 1, key)
    again = compiles.warm("builtin", shards, [families()[4]], ["cpu"], 1, key)
    assert not first.skipped and again.skipped and "skipped" in again.describe()
    assert not compiles.warm("builtin", shards, [families()[4]], ["cpu"], 1, key[::-1]).skipped  # another key
    # A warm-up that met errors leaves no marker: the next one tries again. (The subject's module must be importable
    # in the spawned warm-up processes: they start with this process's sys.path.)
    (tmp_path / "warm_faulty.py").write_text("from harness.subjects.builtin import BuiltinSubject\n"
                                             "class Faulty(BuiltinSubject):\n"
                                             "    def dense_forward(self, *args):\n"
                                             "        raise RuntimeError('planted')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    failed = compiles.warm("warm_faulty:Faulty", shards, [families()[4]], ["cpu"], 1, "faulty")
    assert failed.errors and "planted" in failed.errors[0]
    assert not compiles.warm("warm_faulty:Faulty", shards, [families()[4]], ["cpu"], 1, "faulty").skipped


PTX = """
import json, re, sys
import torch
from harness.draws.cases import Case
from harness.subjects import builtin

case, paged = Case((1,) * 4, (4096,) * 4, 32, 8, 128, 16), sys.argv[1] == "paged"
ptx = builtin.compiled(case, builtin.BuiltinSubject().tile_config(case), paged, torch.float16).asm["ptx"]
print(json.dumps({"vector": len(re.findall(r"cp\\.async\\.cg\\.shared\\.global|ld\\.global\\.v4", ptx)),
                  "scalar16": len(re.findall(r"ld\\.global\\.b16", ptx))}))
"""


def test_unspecialised_strides_still_give_vectorised_loads():
    # Compiled for an H100/H200 (sm_90) here, no GPU needed: K/V rows must load as 16-byte asynchronous copies, as
    # they did when Triton specialised on strides divisible by 16; scalar 2-byte loads would halve decode speed.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for mode in ("paged", "dense"):
        done = subprocess.run([sys.executable, "-c", PTX, mode], cwd=REPO, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        loads = json.loads(done.stdout.strip().splitlines()[-1])
        assert loads["vector"] >= 32 and loads["scalar16"] == 0, (mode, loads)


SASS = """
import json, runpy, torch
from harness.draws.cases import Case
from harness.subjects import builtin

loop_instructions = runpy.run_path("benchmarks/kernel_sass.py")["loop_instructions"]
case = Case((2048,) * 8, (2048,) * 8, 32, 8, 128, 16)
for paged in (False, True):
    sass = builtin.compiled(case, builtin.BuiltinSubject().tile_config(case), paged, torch.float16).asm["sass"]
    print(json.dumps(loop_instructions(sass)))
"""


def test_the_sass_benchmark_counts_the_key_tile_loop():
    # The loop benchmarks/kernel_sass.py counts must be the key-tile loop, whole: on sm_90 a 64 x 64 prefill tile at
    # head dim 128 issues its QK^T dot as 128 / 16 wgmma steps and its PV dot as 64 / 16, all inside that loop.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SASS], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    dense, paged = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    for ops in (dense, paged):
        assert sum(n for op, n in ops.items() if op.startswith("HGMMA")) == 128 // 16 + 64 // 16, ops
    assert "LDG.E" in paged and "LDG.E" not in dense, (paged, dense)  # page ids: only the paged loop reads the table
    spec = importlib.util.spec_from_file_location("kernel_sass", REPO / "benchmarks" / "kernel_sass.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(ValueError, match="no backward branch"):
        module.loop_instructions("Function:f\n--:-:-:-:1\tEXIT;\n")


def test_the_warm_up_runs_behind_and_kernel_items_wait_for_its_end(tmp_path, monkeypatch):
    monkeypatch.setattr(compiles.triton.knobs.cache, "dir", str(tmp_path / "triton"))
    small = small_shards(2, 1)
    monkeypatch.setattr(warmup, "warmup_shards", lambda sizes: small)
    s = sessions.start("builtin", ["0.25.1"], store.ROOT, tmp_path, tmp_path, findings.DIRECTORY, "cpu", "w", "",
                     run="behind")
    warming = warmup.behind(s, ["cpu"], 1)
    assert warming is not None and warming.thread.is_alive()  # returned before the warm-up ended
    compiles.await_warmup(s.run, 120)
    assert not warming.thread.is_alive()
    assert warming.warmup.cases == sum(map(len, small)) * len(warmup.warm_contracts(s)) > 1
    assert any(line == f"kvconform {warming.warmup.describe()}" for line in s.sink.summary(s.releases, warming.lines(), []))
    with pytest.raises(TimeoutError, match="run never did not end within 0.5 s"):
        compiles.await_warmup("never", 0.5)
