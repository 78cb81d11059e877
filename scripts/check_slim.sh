#!/usr/bin/env bash
# Check on the CPU that a release's live GPU lane carry (scripts/vllm-RELEASE-files.txt) holds every vllm module the
# live probe imports: the probe against only the listed files must record what the full wheel recorded.
#
# Usage (from anywhere): scripts/check_slim.sh RELEASE [FILELIST]
#   1. installs vllm==RELEASE (+ its matrix.toml pins) with uv into a fresh venv (~9 GB, about a minute; removed at
#      exit with its uv cache);
#   2. full wheel: runs the probe's drift check (harness.probe's own CLI, in-process) under an import trace, once
#      as is and once with CUDA_VISIBLE_DEVICES= (vLLM then keeps HAS_TRITON, as on a GPU), and prints every
#      vllm/*.py imported that the list lacks ("MISSING vllm/..."), every listed one neither run imported
#      ("UNUSED-BY-PROBE": the suites may still need it), and any data file opened or folder listed under vllm/;
#   3. slim: moves the wheel's vllm/ and its dist-info out of the venv, builds a tree of only the listed vllm/*.py
#      and the dist-info METADATA (as scripts/slim_vllm.sh does), puts it first on PYTHONPATH, checks that vllm
#      comes from it and that an unlisted module does not import, and runs the same drift check twice again.
#   Every probe run compares its live recording with fixtures/contracts/RELEASE.json (made with the full wheel): the
#   contracts with their origins and order, and the observations (which backends were read, what each answered)
#   but for install facts and timings. Exit 0 only when the list misses nothing and all four runs match.
# The kernel library is not carried into the slim tree: on a CPU host it cannot load even from the full wheel (it
# needs libcuda), vLLM logs that and goes on, and the probe's write stand-in replaces its cache op either way.
# PYTHON (env): the interpreter for the venv (default: matrix.toml's python for the release, as uv finds it).
# KEEP=1 (env): keep the work folder (venv, traces) and print where it is.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,21p' "$0"; exit 2; }
release=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
files=$(realpath "${2:-$here/vllm-$release-files.txt}")
[ -f "$files" ] || { echo "check_slim: no file list $files" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/check-slim-$release.XXXXXX")
if [ "${KEEP:-}" = 1 ]; then trap 'echo "check_slim: kept $work"' EXIT; else trap 'rm -rf "$work"' EXIT; fi
mapfile -t reqs < <(PYTHONPATH=$root python3 -c "
import sys
from harness import matrix
r = matrix.get(sys.argv[1])
print(r.python)
print(*r.requirements, sep='\n')" "$release")
export UV_CACHE_DIR=$work/uv-cache
venv=$work/venv
start=$SECONDS
uv venv -q --python "${PYTHON:-${reqs[0]}}" "$venv"
uv pip install -q --python "$venv/bin/python" "${reqs[@]:1}"
echo "check_slim $release: installed ${reqs[*]:1} in $((SECONDS - start)) s"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

cat > "$work/driver.py" <<'PY'
"""trace OUT: record the vllm files the run imports; both modes run harness.probe's CLI --check and then compare
the live recording with the fixture in full."""
import importlib.machinery
import json
import os
import sys

mode, release = sys.argv[1], sys.argv[2]
imported, opened, listed = set(), set(), set()
if mode == "trace":
    import importlib.util

    init = importlib.util.find_spec("vllm").origin  # found, not run: the run's own import of it is traced
    pkg = os.path.dirname(init)
    base = os.path.dirname(pkg)
    find = importlib.machinery.PathFinder.find_spec

    def find_spec(name, path=None, target=None):
        # Every spec found, also of a module whose execution then fails: its file takes part in the run.
        spec = find(name, path, target)
        if spec is not None and spec.origin and spec.origin.startswith(pkg + os.sep):
            imported.add(os.path.relpath(spec.origin, base))
        return spec

    importlib.machinery.PathFinder.find_spec = staticmethod(find_spec)

    def audit(event, args):
        if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes)):
            where = os.path.abspath(os.fsdecode(args[0]))
            if where == pkg or where.startswith(pkg + os.sep):
                rel = os.path.relpath(where, base)
                if event == "open":
                    if not rel.endswith((".py", ".pyc", ".so")):
                        opened.add(rel)
                elif not sys._getframe(1).f_code.co_filename.startswith("<frozen importlib"):
                    listed.add(rel)  # vLLM's own walk over a folder (the import system's listings aside)

    sys.addaudithook(audit)

from harness import fixtures
from harness.probe import __main__ as cli

runs = []
real_probe = cli.probe


def probe():
    runs.append(real_probe())
    return runs[-1]


cli.probe = probe
status = cli.main(["--release", release, "--check"])
sys.stdout.flush()
if mode == "trace":
    with open(sys.argv[3], "w") as f:
        json.dump({"imported": sorted(imported), "opened": sorted(opened), "listed": sorted(listed)}, f)
if not runs:
    print(f"COMPARE vllm {release}: the probe raised, nothing to compare")
    sys.exit(1)
live, recorded = runs[0], fixtures.load(release)
same = True
got, want = [c.to_json() for c in live.contracts], [c.to_json() for c in recorded.contracts]
if got != want:
    same = False
    for c in want:
        if c not in got:
            print(f"COMPARE vllm {release}: recorded contract not in the live recording: {c}")
    for c in got:
        if c not in want:
            print(f"COMPARE vllm {release}: live contract not in the recording: {c}")
    if sorted(map(json.dumps, got)) == sorted(map(json.dumps, want)):
        print(f"COMPARE vllm {release}: same contracts in another order")
facts = ("installed", "probe_s", "install")
lo = {k: v for k, v in live.observations.items() if k not in facts}
ro = {k: v for k, v in recorded.observations.items() if k not in facts}
for key in sorted(lo.keys() | ro.keys()):
    a, b = ro.get(key), lo.get(key)
    if key == "backends" and isinstance(a, dict) and isinstance(b, dict):
        for name in sorted(a.keys() | b.keys()):
            if a.get(name) != b.get(name):
                same = False
                print(f"COMPARE vllm {release}: backend {name}: recorded {json.dumps(a.get(name))[:300]} | "
                      f"live {json.dumps(b.get(name))[:300]}")
    elif a != b:
        same = False
        print(f"COMPARE vllm {release}: observation {key}: recorded {json.dumps(a)[:300]} | live {json.dumps(b)[:300]}")
read = sorted(n for n, o in live.observations.get("backends", {}).items() if o.get("read"))
print(f"COMPARE vllm {release}: {'same' if same else 'DIFFERENT'} contracts ({len(got)} live, {len(want)} recorded)"
      f" and observations; backends read live: {', '.join(read) or 'none'}")
sys.exit(status or (0 if same else 1))
PY

fail=0
run() {  # run LABEL DRIVER-ARGS...: one probe run under the environment e, its output kept and the gist echoed
    local label=$1
    shift
    echo "=== check_slim $release: $label"
    (cd "$work" && env "${e[@]}" "$venv/bin/python" -X faulthandler "$work/driver.py" "$@" 2>&1) | tee "$work/$label.log" |
        grep -E '^(DRIFT|COMPARE|vllm |contract-error|Traceback|[A-Za-z.]*Error)' || true
    grep -q "^COMPARE vllm $release: same" "$work/$label.log" || fail=1
}
for v in cpu cvd; do
    e=(PYTHONPATH=$root PYTHONDONTWRITEBYTECODE=1)
    [ $v = cvd ] && e+=(CUDA_VISIBLE_DEVICES=)
    run "full-$v" trace "$release" "$work/trace-$v.json"
done
grep '^vllm/.*\.py$' "$files" | sort -u > "$work/listed"
sed -n 's/^omit //p' "$files" | sort -u > "$work/omitted"
"$venv/bin/python" - "$work" "$release" <<'PY'
import json, sys
work, release = sys.argv[1:]
t = [json.load(open(f"{work}/trace-{v}.json")) for v in ("cpu", "cvd")]
imported = sorted(set(t[0]["imported"]) | set(t[1]["imported"]))
listed, omitted = (open(f"{work}/{n}").read().split() for n in ("listed", "omitted"))
py = [m for m in imported if m.endswith(".py")]
open(f"{work}/imported", "w").write("".join(f"{m}\n" for m in py if m not in omitted))
for m in sorted(set(py) - set(listed) - set(omitted)):
    print(f"MISSING {m}")
for m in sorted(set(omitted) & set(py)):
    print(f"OMITTED {m} (imported from the full wheel, left out of the carry by the list's 'omit' line)")
for m in sorted(set(listed) - set(py)):
    print(f"UNUSED-BY-PROBE {m}")
for m in sorted(set(imported) - set(py)):
    print(f"EXTENSION {m} (kernel libraries are not listed: scripts/slim_vllm.sh picks the one it carries)")
for kind in ("opened", "listed"):
    for m in sorted(set(t[0][kind]) | set(t[1][kind])):
        print(f"{kind.upper()} {m}")
count = [sum(m.endswith(".py") for m in x["imported"]) for x in t]
print(f"check_slim {release}: the probe imported {len(py)} vllm .py files ({count[0]} as is, {count[1]} with "
      f"CUDA_VISIBLE_DEVICES=); the list has {len(listed)}")
PY
comm -23 "$work/imported" "$work/listed" | grep -q . && fail=1

slim=$work/slim
mkdir -p "$slim/vllm-$release.dist-info"
cp "$site/vllm-$release.dist-info/METADATA" "$slim/vllm-$release.dist-info/"
(cd "$site" && cp --parents $(cat "$work/listed") "$slim/")
mkdir "$work/hidden"
mv "$site/vllm" "$site/vllm-$release.dist-info" "$work/hidden/"
unlisted=$(cd "$work/hidden" && find vllm -name '*.py' | sort | comm -23 - "$work/listed" | grep -v '__init__\.py$' |
           sed -n 1p)
PYTHONPATH=$slim:$root "$venv/bin/python" - "$slim" "${unlisted%.py}" <<'PY' || { echo "check_slim: the slim tree is not what vllm imports from" >&2; exit 1; }
import importlib, importlib.metadata, sys
slim, unlisted = sys.argv[1], sys.argv[2].replace("/", ".")
import vllm
assert vllm.__file__.startswith(slim + "/"), f"vllm comes from {vllm.__file__}, not from {slim}"
try:
    importlib.import_module(unlisted)
except ModuleNotFoundError as e:
    print(f"slim tree: vllm {importlib.metadata.version('vllm')} from {vllm.__file__}; unlisted {unlisted}: {e}")
else:
    sys.exit(f"{unlisted} is not in the list but imports: the full wheel is still reachable")
PY
for v in cpu cvd; do
    e=(PYTHONPATH=$slim:$root PYTHONDONTWRITEBYTECODE=1)
    [ $v = cvd ] && e+=(CUDA_VISIBLE_DEVICES=)
    run "slim-$v" check "$release"
done
echo "check_slim $release: $([ $fail = 0 ] && echo "OK: the listed files record the same contracts and observations as the full wheel" || echo FAILED)"
exit $fail
