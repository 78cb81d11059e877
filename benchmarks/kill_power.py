"""What the generated examples alone catch: each planted-bug subject and each wrong consumer over every recording, on
the CPU (or on the GPU at its sizes: `--device cuda`), under kvconform-generated (the explicit examples off, since
they alone catch most of these; no shrinking: an item stops at its first failing example). A subject is caught on a
(release, geometry, check) where a result line of that item is a finding no known finding predicts. Compare two such
files to show that a change to the strategies or budgets kept what they catch.

    python benchmarks/kill_power.py --out results/kill/after.json            # every subject, this checkout
    python benchmarks/kill_power.py --root ../before --out before.json       # the suites of another checkout
    python benchmarks/kill_power.py --only mutants --jobs 4 --workers 4      # one group; runs side by side
    python benchmarks/kill_power.py --compare before.json after.json         # counts, and every difference
    python benchmarks/kill_power.py --only consumers --device cuda --releases default --max-examples 12 \
        --out gpu-12.json                                                    # at the GPU's sizes and a budget

Each run keeps the failing examples it stores in its own folder: a planted-bug subject is kvconform's own, whose
regressions would otherwise go to the checkout's fixtures/regressions and run first in every later run.

Mutants run the checks that launch their kernels; consumers the checks of the views they are handed (split-agrees,
rejects-malformed). A run that ends other than passed or failed (a usage error, a crash), or a harness-error or
timeout line, is reported and makes the script exit 1: what it could not check is not counted as caught or missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness import matrix, results  # noqa: E402

KERNEL = "bit_identity or determinism or oracle"
VIEWS = "split_agrees or rejects_malformed"
MUTANTS = ("gqa_mapping", "causal_offset", "table_row", "kv_stride_axis", "skip_threshold_ln", "skip_running_max",
           "skip_per_query_tile")
# The consumers that are wrong somewhere (the gallery's and the examples'; their right twins are caught nowhere).
CONSUMERS = ("offloader:ShapeSniffingReader", "five_axis_reader:FiveAxisReader", "test_layer:HalvesC",
             "test_layer:StacksKV", "breakages.flexkv_187:KvFirst", "breakages.flexkv_187:SizeTwoAtOne",
             "breakages.dynamo_12750:OuterContiguous", "breakages.dynamo_12750:ShapeDetected",
             "breakages.fp8_type:AlwaysE4m3", "breakages.kvcached_424:WithoutCacheDtype",
             "breakages.lmcache_4463:SizeTwoIsKV", "breakages.lmcache_4729:LayoutHint",
             "breakages.nixl_hetero_tp:HeadsOutsideTokens", "breakages.vllm_49011:HeadMajorNvfp4",
             "breakages.vllm_55904:RawBlocks", "breakages.diffkv_v_width:VAtKWidth")
GROUPS = {"mutants": {f"mutant:{m}": KERNEL for m in MUTANTS}, "consumers": {c: VIEWS for c in CONSUMERS}}
FINDINGS = ("differs", "accepted", "contract-error", "subject-error")
BROKEN = ("harness-error", "timeout")


def caught(rows: list[results.Result]) -> tuple[list[str], list[str]]:
    """The items (`release|geometry|check`) where `rows` hold a new finding, and the lines that checked nothing."""
    found = sorted({f"{r.release}|{r.geometry}|{r.check}" for r in rows if r.outcome in FINDINGS and not r.known})
    broken = sorted({f"{r.release}|{r.geometry}|{r.check}: {r.outcome}: {r.diagnosis[:200]}" for r in rows
                     if r.outcome in BROKEN})
    return found, broken


@dataclass(frozen=True)
class Setting:
    """Where and how much a run draws: the device (its sizes, harness.draws.strategies), the releases, and max_examples
    in place of kvconform-generated's own (None: the profile's)."""

    device: str = "cpu"
    releases: tuple[str, ...] = ("recorded",)
    max_examples: int | None = None

    def args(self) -> list[str]:
        """The pytest options of this setting."""
        return ([f"--kvconform-release={r}" for r in self.releases]
                + ([f"--kvconform-max-examples={self.max_examples}"] if self.max_examples else []))

    def env(self, root: Path) -> dict[str, str]:
        """The environment of a run: on the CPU the interpreter, the GPU hidden."""
        device = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""} if self.device == "cpu" else {}
        return {**os.environ, **device, "PYTHONPATH": os.pathsep.join([str(root / "examples"), str(root / "tests")])}


def run(root: Path, subject: str, checks: str, out: Path, workers: int, setting: Setting = Setting()) -> dict:
    """One subject over the setting's releases; what it caught."""
    folder = out / subject.replace(":", "_")
    cmd = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-p", "no:randomly", "-q",
           *setting.args(), "--hypothesis-profile=kvconform-generated", f"--kvconform-subject={subject}",
           f"--kvconform-results-dir={folder}", f"--kvconform-regressions-dir={folder / 'regressions'}", "-k", checks,
           "-n", str(workers)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=root, env=setting.env(root), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    rows = results.read(folder) or results.read(folder, files="results.*.jsonl")
    found, broken = caught(rows)
    tail = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode not in (0, 1):
        broken.append(f"pytest exit {done.returncode}: {tail} {done.stderr[-500:]}")
    print(f"{subject:<45} {len(found):>5} caught  {len(rows):>7} lines  {seconds:>6.1f} s  {tail}", flush=True)
    return {"checks": checks, "caught": found, "broken": broken, "lines": len(rows), "seconds": round(seconds, 1),
            "pytest": tail}


def compare(before: dict, after: dict) -> tuple[list[str], int]:
    """One line per subject with its counts, then one per item caught on one side only; and how many of those."""
    lines, differences = [], []
    for subject in sorted(set(before) | set(after)):
        b, a = set(before.get(subject, {}).get("caught", ())), set(after.get(subject, {}).get("caught", ()))
        lines.append(f"{subject:<45} before {len(b):>5}  after {len(a):>5}  lost {len(b - a):>4}  "
                     f"gained {len(a - b):>4}")
        differences += [f"  lost   {subject} {item}" for item in sorted(b - a)]
        differences += [f"  gained {subject} {item}" for item in sorted(a - b)]
    total = (sum(len(v["caught"]) for v in before.values()), sum(len(v["caught"]) for v in after.values()))
    return (lines + [f"{'all':<45} before {total[0]:>5}  after {total[1]:>5}  differences {len(differences)}"]
            + differences, len(differences))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/kill_power.py")
    parser.add_argument("--out", type=Path, help="the JSON file to write")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose suites run (default: this one)")
    parser.add_argument("--only", default="", help=f"comma list of groups ({', '.join(GROUPS)}) or subjects")
    parser.add_argument("--jobs", type=int, default=1, help="subjects run side by side")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers of each subject's run")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: Triton's interpreter at the CPU's sizes; cuda: the GPU at its sizes")
    parser.add_argument("--releases", default="recorded",
                        help="'recorded' (every recording), 'default' (matrix.toml's subset) or a comma list")
    parser.add_argument("--max-examples", type=int, default=None,
                        help="max_examples in place of kvconform-generated's (each check's budget follows from it)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text())["subjects"] for p in args.compare)
        lines, differences = compare(before, after)
        print("\n".join(lines))
        return 1 if differences else 0
    if args.out is None:
        parser.error("--out FILE (or --compare BEFORE AFTER)")
    chosen = {s: k for g in GROUPS.values() for s, k in g.items()}
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n not in GROUPS and n not in chosen]
        if unknown:
            parser.error(f"--only {args.only}: unknown {', '.join(unknown)}; groups: {', '.join(GROUPS)}")
        chosen = {s: k for n in names for s, k in (GROUPS[n].items() if n in GROUPS else [(n, chosen[n])])}
    releases = (tuple(r.name for r in matrix.default()) if args.releases == "default"
                else tuple(args.releases.split(",")))
    setting = Setting(args.device, releases, args.max_examples)
    folder = args.out.with_suffix("")
    with ThreadPoolExecutor(args.jobs) as pool:
        done = dict(zip(chosen, pool.map(
            lambda s: run(args.root.resolve(), s, chosen[s], folder, args.workers, setting), chosen)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    facts = {"root": str(args.root), "device": setting.device, "releases": list(releases),
             "max_examples": setting.max_examples}
    args.out.write_text(json.dumps({**facts, "subjects": done}, indent=1) + "\n")
    broken = [f"{s}: {b}" for s, v in done.items() for b in v["broken"]]
    print("\n".join(["could not check:", *broken]) if broken else f"{len(done)} subjects, nothing left unchecked")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
