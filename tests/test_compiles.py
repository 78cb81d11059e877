"""Compiles are bounded and counted: the built-in kernel specialises on its declared constexprs and dtypes only,
the warm-up cases span every variant an example can draw, and the cache layer counts compiles and loads apart."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined; warm-up processes inherit it

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness import compiles  # noqa: E402
from harness.contract import families  # noqa: E402
from harness.strategies import CPU, GPU, examples, warmup_shards  # noqa: E402
from harness.subjects import load_subject  # noqa: E402
from harness.subjects.builtin import BuiltinSubject, num_splits, variant  # noqa: E402

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


def _warm_variants(sizes):
    out = set()
    for shard in warmup_shards(sizes):
        for case in shard:
            if SUBJECT.supports(case) is None:
                tile = SUBJECT.tile_config(case)
                out |= {variant(case, tile, paged) for paged in (True, False)}
    return out


WARM = {"gpu": _warm_variants(GPU), "cpu": _warm_variants(CPU)}


@settings(max_examples=300, deadline=None)
@given(data=st.data(), sizes=st.sampled_from(("gpu", "cpu")))
def test_the_warm_up_spans_every_variant_an_example_can_draw(data, sizes):
    ex = data.draw(examples(families(), GPU if sizes == "gpu" else CPU))
    if SUBJECT.supports(ex.case) is not None:
        return
    tile = SUBJECT.tile_config(ex.case)
    for paged in (True, False):
        assert variant(ex.case, tile, paged) in WARM[sizes], (ex.case, tile, paged, num_splits(ex.case, tile))


def test_the_warm_up_is_small():
    # ~200 compiles on the GPU sizes: seconds each, so a session warm-up spread over 16 processes is about a minute.
    assert len(WARM["gpu"]) <= 200, len(WARM["gpu"])


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


def test_the_warm_up_runs_the_subject_in_parallel_processes():
    # On the CPU nothing compiles (the interpreter), but every case must run through both forwards without error.
    shards = [[c for c in shard if max(c.kv_lens) <= 32][:2] for shard in warmup_shards(CPU)[:4]]
    done = compiles.warm("builtin", shards, families()[4], ["cpu"], 2)
    assert done.errors == () and done.cases == sum(map(len, shards)) and done.processes == 2
    assert done.counts == compiles.Counts(0, 0)


def test_a_finished_warm_up_is_not_repeated_in_the_same_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(compiles.triton.knobs.cache, "dir", str(tmp_path))
    shards = [[c for c in shard if max(c.kv_lens) <= 32][:1] for shard in warmup_shards(CPU)[:2]]
    subject = load_subject("builtin")
    key = compiles.fingerprint(subject, shards, ["cpu"])
    assert key != compiles.fingerprint(subject, shards[:1], ["cpu"])  # other cases, another warm-up
    first = compiles.warm("builtin", shards, families()[4], ["cpu"], 1, key)
    again = compiles.warm("builtin", shards, families()[4], ["cpu"], 1, key)
    assert not first.skipped and again.skipped and "skipped" in again.describe()
    assert not compiles.warm("builtin", shards, families()[4], ["cpu"], 1, key[::-1]).skipped  # another key
    # A warm-up that met errors leaves no marker: the next one tries again. (The subject's module must be importable
    # in the spawned warm-up processes: they start with this process's sys.path.)
    (tmp_path / "warm_faulty.py").write_text("from harness.subjects.builtin import BuiltinSubject\n"
                                             "class Faulty(BuiltinSubject):\n"
                                             "    def dense_forward(self, *args):\n"
                                             "        raise RuntimeError('planted')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    failed = compiles.warm("warm_faulty:Faulty", shards, families()[4], ["cpu"], 1, "faulty")
    assert failed.errors and "planted" in failed.errors[0]
    assert not compiles.warm("warm_faulty:Faulty", shards, families()[4], ["cpu"], 1, "faulty").skipped


PTX = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from harness.cases import Case
from harness.subjects import builtin

case, paged = Case((1,) * 4, (4096,) * 4, 32, 8, 128, 16), sys.argv[1] == "paged"
tile = builtin.BuiltinSubject().tile_config(case)
fn, cx = builtin._attn_fwd, builtin.constexprs(case, tile, paged)
names = [p.name for p in fn.params]
partial = "*fp32" if cx["SPLIT"] else "*fp16"
types = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "out_ptr": "*fp16", "part_ptr": partial,
         "stats_ptr": partial, "scale_log2": "fp32", "log2_threshold": "fp32"}
sig = {n: "constexpr" if p.is_constexpr else types.get(n, "*i32" if n.endswith("_ptr") else "i32")
       for n, p in zip(names, fn.params)}
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}  # torch's allocations
src = ASTSource(fn, sig, {(names.index(k),): v for k, v in cx.items()}, attrs)
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": tile.num_warps,
                     "num_stages": tile.num_stages}).asm["ptx"]
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
