"""nvidia-modelopt over every recorded vLLM release: its vLLM plugin's own K/V split of each recorded geometry, then
its Triton kernel paged vs dense, in a pinned-tile lane and an autotuned lane.

    python benchmarks/gpu_modelopt.py [--fixtures DIR]

Per release (fixtures/contracts/<release>.json, replayed: the plugin sees a stand-in FlashAttentionBackend with the
layout methods the release's probe recorded) and per recorded geometry, for a few realistic cases per sparsity mode:
- split-agrees: the plugin's K/V views alias exactly the contract's views (memory, shape, strides);
- bit-identity (one pinned tile for both calls): paged over the plugin's views (K/V written through the contract's
  views, spare pages NaN) vs dense over contiguous K/V; determinism: the same paged call twice;
- ulp-autotuned (modelopt's own autotuner, each call tuned for itself): max ULP and abs distance paged vs dense, and
  of the paged output across all geometries; figures with a tolerance verdict, never bit-identity.
Prints one line per release, then markdown matrices in the harness's outcome words, marking outcomes that the known
findings (fixtures/known_findings/modelopt.toml) predict. With OUT set, writes $OUT/modelopt.jsonl (one
harness.results.Result per check and case) and $OUT/modelopt.md (the matrices).
Without CUDA it runs tiny cases in Triton's interpreter (TRITON_INTERPRET=1 needed) and leaves out the autotuned
lane, whose autotuner needs a GPU to time its candidates.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import checks, findings, fixtures, vllm_api  # noqa: E402
from harness.layer import in_force, layer_for  # noqa: E402
from harness.cache import paging, write  # noqa: E402
from harness.cases import Case, Sparsity  # noqa: E402
from harness.compare import Diagnosis, diagnose  # noqa: E402
from harness.contract import Contract, ContractError, Dims  # noqa: E402
from harness.results import PASSING, Result  # noqa: E402
from kvconform.subjects.modelopt import ModeloptSubject, ModeloptUnavailable, VllmRelease, split_mismatch  # noqa: E402

KERNEL_ROWS = (checks.BIT_IDENTITY.name, checks.DETERMINISM.name)  # the pinned lane's checks

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
UNIT_ROUNDOFF = {"float16": 2**-11, "bfloat16": 2**-8, "float32": 2**-24}


def cases() -> dict[str, Case]:
    """A few cases per sparsity mode: realistic on the GPU (32/8 heads, head dim 128), tiny in the interpreter."""
    if not CUDA:
        h = dict(num_heads=4, kv_heads=2, head_dim=32, block_size=16)
        return {
            "mixed": Case((1, 5, 20), (7, 5, 37), **h),
            "mixed skip0.3": Case((1, 5, 20), (7, 5, 37), **h, sparsity=Sparsity("skip_softmax", threshold=0.3)),
            "mixed nm2:4": Case((1, 5, 20), (7, 5, 37), **h, dtype="bfloat16",
                                sparsity=Sparsity("nm", n=2, m=4, sink=2, recent=8)),
        }
    h = dict(num_heads=32, kv_heads=8, head_dim=128, block_size=16)
    skip, nm24, nm48 = (Sparsity("skip_softmax", threshold=0.1), Sparsity("nm", n=2, m=4, sink=4, recent=64),
                        Sparsity("nm", n=4, m=8, sink=0, recent=128))
    return {
        "prefill 4x1k": Case((1024,) * 4, (1024,) * 4, **h),
        "chunked 2x512 of 4k/3k": Case((512, 512), (4096, 3000), **h),
        "decode 32 x 257..8193": Case((1,) * 32, tuple(range(257, 8194, 256)), **h),
        "mixed bf16": Case((1, 1, 77, 600), (5000, 17, 1500, 600), **h, dtype="bfloat16"),
        "prefill 4x1k skip0.1": Case((1024,) * 4, (1024,) * 4, **h, sparsity=skip),
        "mixed bf16 skip0.1": Case((1, 1, 77, 600), (5000, 17, 1500, 600), **h, dtype="bfloat16", sparsity=skip),
        "chunked nm2:4": Case((512, 512), (4096, 3000), **h, sparsity=nm24),
        "mixed bf16 nm4:8": Case((1, 1, 77, 600), (5000, 17, 1500, 600), **h, dtype="bfloat16", sparsity=nm48),
    }


def _split(subject: ModeloptSubject, kv: torch.Tensor, contract: Contract, dims: Dims, dtype: torch.dtype):
    """The plugin's split of `kv`, handed the layer its release gives a cache of `contract`."""
    rec = subject.release.recording
    layer = layer_for(contract, dims, dtype, vllm_api.backend_class(rec, contract.origin.backend_name),
                      rec.release, rec)
    with in_force(layer):
        return subject.split(kv, layer)


def dims_for(contract: Contract, case: Case) -> Dims:
    spare = 3  # pages no sequence uses, left NaN, so a read through a wrong view shows
    layers = dict(num_layers=3, layer=1) if contract.shared else {}
    return Dims(case.blocks_needed() + spare, case.block_size, case.kv_heads, case.head_dim, **layers)


def verdict(d: Diagnosis | None, case: Case, v: torch.Tensor) -> tuple[str, str]:
    """The autotuned lane's outcome: within-tolerance when the distance stays inside the rounding budget of a
    different tile (fp32 accumulation in another order, P rounded to the input dtype at another running max,
    the output rounded once: 4 unit roundoffs of max|V|), else differs."""
    budget = 4 * UNIT_ROUNDOFF[case.dtype] * float(v.abs().max())
    if d is None:
        return "within-tolerance", "max ULP 0, max abs 0"
    figures = f"max ULP {d.max_ulp:g}, max abs {d.max_abs:.3g} (budget {budget:.3g}); {d}"
    return ("within-tolerance" if d.max_abs <= budget else "differs"), figures


class Run:
    """Checks, memoized per (geometry, recorded layout methods): the plugin's split and the paged forward depend on
    nothing else, so releases that share a recording's geometry share its results."""

    def __init__(self, subject: ModeloptSubject, known: tuple, autotune: bool) -> None:
        self.subject, self.known, self.autotune = subject, known, autotune
        self.cases = cases()
        self.inputs = {name: case.inputs(DEVICE) for name, case in self.cases.items()}
        self.dense: dict[tuple[str, str], tuple[torch.Tensor, object]] = {}  # (case, lane) -> (out, tile it ran)
        self.paged_auto: dict[str, list[tuple[str, torch.Tensor]]] = defaultdict(list)  # case -> (geometry, out)
        self.memo: dict[tuple, list[tuple[str, str, str, str, str, str]]] = {}
        self.results: list[Result] = []

    def release(self, rec: fixtures.Recording) -> list[Result]:
        vr = VllmRelease.from_recording(rec)
        subject = self.subject.for_release(vr)
        out = []
        for contract in rec.contracts:
            key = (contract.logical, contract.physical, vr.backend_methods)
            if key not in self.memo:
                self.memo[key] = self.geometry(subject, contract)
            for check, sparsity, outcome, case, repro, diagnosis in self.memo[key]:
                hit = findings.match(self.known, rec.release, contract.name, sparsity, check, outcome)
                out.append(Result(run="gpu_modelopt", release=rec.release, source="replay", subject="modelopt",
                                  geometry=contract.name, check=check, sparsity=sparsity, outcome=outcome, case=case,
                                  repro=f"vllm {rec.release} {contract.name} {repro}", diagnosis=diagnosis,
                                  known=hit.id if hit else "", cache_dtype=contract.cache_dtype,
                                  family=contract.family, order=".".join(contract.physical),
                                  backends=(contract.origin.backend_name,),
                                  layers="cross-layer" if contract.shared else "per-layer"))
        self.results.extend(out)
        return out

    def geometry(self, subject: ModeloptSubject, contract: Contract) -> list[tuple]:
        rows = []
        first = next(iter(self.cases.values()))
        kv = contract.allocate(dims_for(contract, first), first.torch_dtype, DEVICE)
        try:
            views = _split(subject, kv, contract, dims_for(contract, first), first.torch_dtype)
        except ContractError as err:
            return [(checks.SPLIT_AGREES.name, "*", "contract-error", "", "plugin split", str(err))] + [
                (check, case.sparsity.mode, "contract-error", case.digest(), repr(case), str(err))
                for check in KERNEL_ROWS + ((checks.ULP_AUTOTUNED.name,) * self.autotune)
                for case in self.cases.values()]
        bad = split_mismatch(views, contract.split(kv))
        rows.append((checks.SPLIT_AGREES.name, "*", "differs" if bad else "bit-identical", "", "plugin split", bad or ""))
        for name, case in self.cases.items():
            rows.extend(self.case(subject, contract, name, case))
        return rows

    def case(self, subject: ModeloptSubject, contract: Contract, name: str, case: Case) -> list[tuple]:
        mode, digest = case.sparsity.mode, case.digest()
        reason = subject.supports(case)
        if reason:
            return [(c, mode, "unsupported", digest, repr(case), reason)
                    for c in KERNEL_ROWS + ((checks.ULP_AUTOTUNED.name,) * self.autotune)]
        q, k, v = self.inputs[name]
        dims = dims_for(contract, case)
        kv = contract.allocate(dims, case.torch_dtype, DEVICE)
        pg = paging(case.kv_lens, case.block_size, dims.num_blocks, seed=case.seed)
        write(*contract.split(kv, dims), pg, k, v)  # where the release puts K and V
        k_cache, v_cache = _split(subject, kv, contract, dims, case.torch_dtype)  # what the plugin reads
        rows = []
        tile = subject.tile_config(case)
        try:
            dense, _ = self.dense_out(subject, name, case, "pinned", tile)
            paged = subject.paged_forward(case, q, k_cache, v_cache, pg, tile)
            again = subject.paged_forward(case, q, k_cache, v_cache, pg, tile)
        except Exception as err:  # noqa: BLE001 - modelopt raising on a case it supports is the finding
            return [(checks.BIT_IDENTITY.name, mode, "subject-error", digest, repr(case), f"{type(err).__name__}: {err}")]
        for check, d in zip(KERNEL_ROWS, (diagnose(paged, dense), diagnose(again, paged))):
            rows.append((check, mode, "bit-identical" if d is None else "differs", digest, f"{name} tile={tile}",
                         "" if d is None else str(d)))
        if self.autotune:
            try:
                dense_a, dense_tile = self.dense_out(subject, name, case, "auto", None)
                paged_a = subject.paged_forward(case, q, k_cache, v_cache, pg, None)
            except Exception as err:  # noqa: BLE001
                why = f"{type(err).__name__}: {err}"
                rows.append((checks.ULP_AUTOTUNED.name, mode, "subject-error", digest, repr(case), why))
                return rows
            outcome, figures = verdict(diagnose(paged_a, dense_a), case, v)
            rows.append((checks.ULP_AUTOTUNED.name, mode, outcome, digest, f"{name} autotuned",
                         f"paged tuned to {subject.last_tile}, dense to {dense_tile}; {figures}"))
            self.paged_auto[name].append((contract.name, paged_a))
        return rows

    def dense_out(self, subject: ModeloptSubject, name: str, case: Case, lane: str, tile) -> tuple:
        """The dense output of a case in a lane (computed once: it depends on no geometry) and its tile."""
        if (name, lane) not in self.dense:
            q, k, v = self.inputs[name]
            out = subject.dense_forward(case, q, k, v, tile)
            self.dense[(name, lane)] = (out, subject.last_tile)
        return self.dense[(name, lane)]

    def across_geometries(self) -> list[str]:
        """Autotuned paged output of each case across every geometry run, against the first one."""
        lines = []
        for name, outs in self.paged_auto.items():
            base_geo, base = outs[0]
            worst = max((diagnose(o, base) for _, o in outs[1:]), key=lambda d: d.max_ulp if d else 0, default=None)
            lines.append(f"{name}: {len(outs)} geometries, max ULP vs {base_geo}: {worst.max_ulp if worst else 0:g}")
        return lines


def cell(results: list[Result]) -> str:
    counts = Counter(r.outcome for r in results)
    new = sum(1 for r in results if r.outcome not in PASSING and not r.known)
    text = ", ".join(f"{o} {n}" for o, n in counts.most_common())
    if any(r.outcome not in PASSING for r in results):
        text += " (NEW)" if new else " (known)"
    return text


def matrix(results: list[Result], checks: tuple[str, ...], title: str) -> str:
    rel = list(dict.fromkeys(r.release for r in results))
    geos = list(dict.fromkeys(r.geometry for r in results))
    lines = [f"### {title}", "", "| release | " + " | ".join(geos) + " |", "|---|" + "---|" * len(geos)]
    for release in rel:
        row = [cell([r for r in results if r.release == release and r.geometry == g and r.check in checks]) or "-"
               for g in geos]
        lines.append(f"| {release} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", type=Path, default=fixtures.ROOT, help="directory of recorded contracts")
    args = ap.parse_args()
    if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("no CUDA device: run with TRITON_INTERPRET=1 for the interpreter's tiny cases")
    start = time.time()
    releases = fixtures.releases(args.fixtures)
    if not releases:
        sys.exit(f"no recorded contracts under {args.fixtures}")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    subject = ModeloptSubject()
    try:
        version, live = subject.version, subject.live
    except ModeloptUnavailable as err:
        print(f"install-error: {err}")
        if out_dir:
            with open(out_dir / "modelopt.jsonl", "w") as f:
                for release in releases:
                    f.write(json.dumps(asdict(Result(run="gpu_modelopt", release=release, source="replay",
                                                     subject="modelopt", check=checks.INSTALL.name,
                                                     outcome="install-error", diagnosis=str(err)))) + "\n")
        return 1
    if live:
        sys.exit("vLLM is installed here: this script replays recorded releases; run it where vLLM is absent")
    import triton

    print(f"nvidia-modelopt {version}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name() if CUDA else 'CPU (Triton interpreter, tiny cases, no autotuned lane)'}")
    print(f"pinned tile {subject.tile_config(next(iter(cases().values())))}; releases: {' '.join(releases)}")
    run = Run(subject, findings.load("modelopt"), autotune=CUDA)
    for release in releases:
        t0 = time.time()
        rec = fixtures.load(release, args.fixtures)
        res = run.release(rec)
        by_check = {c: Counter(r.outcome for r in res if r.check == c)
                    for c in (checks.SPLIT_AGREES.name, checks.BIT_IDENTITY.name, checks.DETERMINISM.name, checks.ULP_AUTOTUNED.name)}
        ulps = [float(re.search(r"max ULP (\S+),", r.diagnosis).group(1)) for r in res
                if r.check == checks.ULP_AUTOTUNED.name and "max ULP" in r.diagnosis]
        summary = "; ".join(f"{c} " + ", ".join(f"{o} {n}" for o, n in cnt.most_common())
                            for c, cnt in by_check.items() if cnt)
        new = sum(1 for r in res if r.outcome not in PASSING and not r.known)
        print(f"vllm {release} ({rec.observations.get('era', '?')}, FlashAttentionBackend methods "
              f"{sorted(VllmRelease.from_recording(rec).backend_methods) or 'none'}): {len(rec.contracts)} geometries; "
              f"{summary}; new findings {new}; {time.time() - t0:.1f}s")
        if ulps:
            print(f"    autotuned paged vs dense: max ULP {max(ulps):g} over {len(ulps)} (geometry, case) pairs, "
                  f"{sum(u == 0 for u in ulps)} with no difference")
    report = "\n\n".join([
        matrix(run.results, (checks.SPLIT_AGREES.name, checks.BIT_IDENTITY.name, checks.DETERMINISM.name), "pinned tile: split-agrees, bit-identity, "
               "determinism (counts per release x geometry)"),
        matrix(run.results, (checks.ULP_AUTOTUNED.name,), "autotuned lane: paged vs dense within the rounding budget of a "
               "different tile (never bit-identity)") if CUDA else "autotuned lane: not run (no CUDA)",
        "autotuned paged output across geometries:\n" + "\n".join(run.across_geometries() or ["(not run)"]),
    ])
    print("\n" + report)
    new = [r for r in run.results if r.outcome not in PASSING and not r.known]
    print(f"\n{len(run.results)} results, {len(new)} new findings, {time.time() - start:.0f}s wall")
    for r in new[:20]:
        print(f"  NEW {r.release} {r.geometry} {r.check} {r.sparsity} {r.outcome}: {r.diagnosis[:300]}")
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "modelopt.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in run.results))
        (out_dir / "modelopt.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
