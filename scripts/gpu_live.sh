#!/usr/bin/env bash
# Run the conformance suites live against carried vLLM releases on a GPU host without network and without vLLM.
#
# Usage (from the repo root): scripts/gpu_live.sh RELEASE[,RELEASE...] [pytest args...]
# For each release: unpack .vllm-slim/vllm-RELEASE-slim.tar.xz (scripts/slim_vllm.sh) into a temp dir, put it and
# its site312/ (wheels the image lacks; sitecustomize.py = scripts/gpu_lane_stubs.py) first on PYTHONPATH, print the
# live probe's drift check against fixtures/contracts/RELEASE.json, then run
#   python3 -m pytest conformance --kvconform-release RELEASE -p no:cacheprovider --kvconform-results-dir=$OUT_DIR/gpu-live [args]
# OUT_DIR: default $OUT (the device runner's output folder), else ./results. PYTHON: default python3.
# Exit status: 0 when every release's probe check and pytest run passed, else the last failing status.
set -uo pipefail
[ $# -ge 1 ] || { sed -n '4,10p' "$0"; exit 2; }
releases=$1
shift
out=${OUT_DIR:-${OUT:-$PWD/results}}/gpu-live
py=${PYTHON:-python3}
base=${PYTHONPATH:-}
status=0
for release in ${releases//,/ }; do
    archive=.vllm-slim/vllm-$release-slim.tar.xz
    if [ ! -f "$archive" ]; then
        echo "gpu_live: $archive missing (build it with scripts/slim_vllm.sh $release)" >&2
        status=2
        continue
    fi
    tree=$(mktemp -d)
    tar -C "$tree" -xJf "$archive"
    echo "=== vllm $release: $archive unpacked into $tree"
    export PYTHONPATH=$tree:$tree/site312${base:+:$base}
    $py -c "import importlib.metadata as m, vllm; print('vllm', m.version('vllm'), 'from', vllm.__file__)"
    $py -m harness.probe --release "$release" --check || status=$?
    $py -m pytest conformance --kvconform-release "$release" -p no:cacheprovider --kvconform-results-dir="$out" "$@" || status=$?
    rm -rf "$tree"
done
export PYTHONPATH=$base
exit $status
