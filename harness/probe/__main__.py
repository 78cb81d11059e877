"""Probe the installed vLLM and record (or, with --check, compare against) its fixture.

    python -m harness.probe [--release NAME] [--check] [--install JSON]

NAME is the matrix entry (default: the installed version; `main` for a nightly build). --check exits 1 and prints
the drift when the live contracts differ from fixtures/contracts/NAME.json; otherwise the recording is saved there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from harness.matrix import build
from harness.probe import ProbeError, probe, release
from harness.recordings import allocations, store
from harness.recordings.drift import drift


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.probe")
    ap.add_argument("--release", help="matrix name to record under (default: the installed version)")
    ap.add_argument("--check", action="store_true", help="compare with the recording; exit 1 on drift")
    ap.add_argument("--install", default="{}", help="JSON install facts (times) to keep with the recording")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        live = probe()
    except ProbeError as e:
        print(f"contract-error: {e}", file=sys.stderr)
        return 3
    name = args.release or live.release
    obs = dict(live.observations, installed=release(), build=dataclasses.asdict(build.installed()),
               probe_s=round(time.perf_counter() - start, 1))
    obs.update(json.loads(args.install) and {"install": json.loads(args.install)})
    live = dataclasses.replace(live, release=name, observations=obs)
    for c in live.contracts:
        print(f"  {c.describe()}")
    found = live.observations["allocations"]
    for model, record in found.get("models", {}).items():
        print(f"  allocation {model}: {allocations.cell(record)}")
    if not found["read"]:
        print(f"  allocations not read: {found['why']}")
    if args.check:
        diff = drift(store.load(name), live)
        for line in diff:
            print(f"DRIFT vllm {name}: {line}", file=sys.stderr)
        print(f"vllm {name}: {'drift' if diff else 'no drift'} against {store.path(name)}")
        return 1 if diff else 0
    print(f"vllm {name}: recorded {len(live.contracts)} contracts to {store.save(live)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
