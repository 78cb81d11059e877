#!/usr/bin/env bash
# Build the live-vLLM GPU lane's carry: one vLLM release's Python sources that the probe and the attention backend
# import, its `_C_stable_libtorch.abi3.so` (reshape_and_cache_flash), the small py3.12 wheels the GPU image lacks,
# and scripts/gpu_lane_stubs.py as sitecustomize (stand-ins for dependencies that never touch the KV cache).
# Usage: scripts/slim_vllm.sh 0.26.0 FILELIST WHEELDIR  ->  .vllm-slim/vllm-<release>-slim.tar.xz (< 64 MiB)
# FILELIST: vllm/ paths to keep (from sys.modules after `python -m harness.probe` against the full wheel).
set -euo pipefail
release=$1 files=$2 wheels=$3
work=$(mktemp -d)
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d "$work" "vllm==$release"
(cd "$work" && unzip -q vllm-*.whl "vllm/*.py" "vllm/_C_stable_libtorch.abi3.so" "vllm-$release.dist-info/METADATA")
strip --strip-unneeded "$work/vllm/_C_stable_libtorch.abi3.so"
pip install -q --no-deps --no-compile --target "$work/site312" --python-version 3.12 --only-binary=:all: "$wheels"/*.whl
cp "$(dirname "$0")/gpu_lane_stubs.py" "$work/site312/sitecustomize.py"
mkdir -p .vllm-slim
tar cJf ".vllm-slim/vllm-$release-slim.tar.xz" -C "$work" -T "$files" "vllm-$release.dist-info/METADATA" \
    vllm/_C_stable_libtorch.abi3.so --exclude=bin site312
rm -rf "$work"
ls -la ".vllm-slim/vllm-$release-slim.tar.xz"
