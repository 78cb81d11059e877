"""`python -m kvconform.bench` (`nox -s bench`): the performance lane (harness.performance) for subjects named as
`--kvconform-subject` names them, over matrix.toml's default subset (replayed; with vLLM installed, its release).

    python -m kvconform.bench                                   # builtin, every workload
    python -m kvconform.bench --subject builtin --subject modelopt --workload "decode *"

Writes results/<release>/performance.jsonl (harness.results.timings), prints a line per cell as it is timed and a table
per subject, and exits 1 on a new performance finding (a cell slower than its limit, or not timed, that no known finding
of the subject predicts), 2 when it cannot run (no CUDA, a subject without forwards).
"""

from __future__ import annotations

import argparse
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import torch

from harness import matrix, performance
from harness.device import devices
from harness.recordings import store
from harness.results import findings, new_run_id, timings
from harness.results.timings import NOT_TIMED, SLOWER, STALE, WITHIN, Timing
from harness.run.releases import load_release, releases_asked, vllm_installed
from harness.subjects import FORWARD, capabilities_of
from kvconform.subjects import load_subject


def table(lines: list[Timing]) -> list[str]:
    """Per release and workload of one subject: the worst timed ratio, where, and the words counted."""
    out = [f"{'release':<12} {'workload':<24} {'tile':<20} {'worst':>7} {'limit':>6}  geometry / words"]
    keys = dict.fromkeys((x.release, x.workload, x.tile) for x in lines if x.outcome != STALE)
    for release, workload, tile in keys:
        cell = [x for x in lines if (x.release, x.workload, x.tile) == (release, workload, tile)]
        timed = [x for x in cell if x.outcome in (WITHIN, SLOWER)]
        words = {}
        for x in cell:
            w = x.outcome + (" [known]" if x.known else "")
            words[w] = words.get(w, 0) + 1
        said = ", ".join(f"{w} {n}" for w, n in words.items())
        if timed:
            worst = max(timed, key=lambda x: x.ratio)
            out.append(f"{release:<12} {workload:<24} {tile:<20} {worst.ratio:6.3f}x {worst.limit:6.3f}  "
                       f"{worst.geometry}; {said}")
        else:
            out.append(f"{release:<12} {workload:<24} {tile:<20} {'-':>7} {'':>6}  {said}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvconform.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--subject", action="append", help="builtin (default), modelopt, contiguous-views, module:Class")
    ap.add_argument("--release", action="append", help="a recorded release, or 'recorded' for all (default: "
                    "matrix.toml's default subset; with vLLM installed, its release)")
    ap.add_argument("--workload", action="append", help="glob over the workloads (default: all): "
                    + ", ".join(performance.WORKLOADS))
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--contracts-dir", type=Path, default=store.ROOT)
    ap.add_argument("--known-findings", type=Path, default=findings.DIRECTORY)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kvconform bench: no CUDA device: the performance lane times compiled kernels (Triton's interpreter "
              "on the CPU says nothing of their time)", file=sys.stderr)
        return 2
    devices.prepare_triton()
    workloads = {n: c for n, c in performance.WORKLOADS.items()
                 if any(fnmatchcase(n, g) for g in args.workload or ["*"])}
    if not workloads:
        print(f"kvconform bench: --workload {args.workload} matches none of {list(performance.WORKLOADS)}",
              file=sys.stderr)
        return 2
    asked = args.release or ([] if vllm_installed() else [r.name for r in matrix.default()])
    try:
        names = releases_asked(asked, args.contracts_dir)
        subjects = [load_subject(s) for s in args.subject or ["builtin"]]
    except ValueError as e:
        print(f"kvconform bench: {e}", file=sys.stderr)
        return 2
    for s in subjects:
        if FORWARD not in capabilities_of(s):
            print(f"kvconform bench: subject {s.name} declares no forward: nothing to time", file=sys.stderr)
            return 2
    releases = [load_release(r, args.contracts_dir) for r in names]
    for r in releases:
        print(f"kvconform bench: {r.describe()}", flush=True)
    run = new_run_id()
    rates = performance.measured_rates(performance.cuda_timer)
    print(f"kvconform bench: run {run} on {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"{rates.describe()}; {timings.BAND_RUNS} dense runs x {timings.REPEATS} repeats per band, "
          f"{timings.REPEATS} paged repeats per cell", flush=True)
    new = 0
    for s in subjects:
        lines = performance.lane(s, releases, workloads, findings.load_performance(s.name, args.known_findings),
                                 findings.load(s.name, args.known_findings), performance.cuda_timer, rates, run,
                                 say=lambda text: print(text, flush=True))
        timings.write(args.results, lines)
        print(f"\n{s.name}: paged / dense, worst cell per release, workload and tile")
        print("\n".join(table(lines)))
        fresh = [x for x in lines if x.new_finding]
        for x, releases in performance.alike(fresh):
            print(f"NEW PERFORMANCE FINDING: {performance.said(x)} [{', '.join(releases)}]")
        for x in lines:
            if x.outcome == STALE:
                print(f"stale known performance finding {x.known} on {x.release}: {x.diagnosis}")
        new += len(fresh)
        print(f"{s.name}: {len(lines)} lines: " + ", ".join(
            f"{w} {sum(x.outcome == w for x in lines)}" for w in (WITHIN, SLOWER, NOT_TIMED, STALE))
            + f"; {len(fresh)} new findings", flush=True)
    print(f"kvconform bench: {'FAILED: ' + str(new) + ' new performance findings' if new else 'no new performance findings'}"
          f"; lines in {args.results}/<release>/{timings.FILE}")
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
