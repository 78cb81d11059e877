#!/usr/bin/env bash
# Build the live-vLLM GPU lane's carry for one release: the vLLM Python sources that the live probe and the suites
# import, the release's kernel library that registers torch.ops._C_cache_ops.reshape_and_cache_flash
# (_C_stable_libtorch.abi3.so from 0.25, _C.abi3.so before; picked by which one holds the op), the py3.12 wheels the
# GPU image lacks, and scripts/gpu_lane_stubs.py as site312/sitecustomize.py (named stand-ins).
#
# Usage: scripts/slim_vllm.sh RELEASE [FILELIST] [WHEELDIR]  ->  .vllm-slim/vllm-RELEASE-slim.tar.xz
#   FILELIST (default scripts/vllm-RELEASE-files.txt): 'pip NAME==VER' lines (wheels into site312/), vllm/ paths to
#     keep (how they were found, and scripts/check_slim.sh that checks them: see the list's header), 'omit vllm/...'
#     lines (never carried), '#' comments.
#   WHEELDIR: optional folder of further wheels to install into site312/.
#   SM (env, default 90 = H100/H200): the kernel library is stripped and its CUDA fatbins keep only the SM_$SM cubins
#     (sm_90 and sm_90a); a fatbin container without one is emptied in place (size 0; offsets, which the host code
#     registers, unchanged). Host code and the kept device code are the release's own bytes. Kernels that exist only
#     as other-arch cubins or PTX (none of the cache ops) then report "no kernel image" on the device. Checked on an
#     H200 for 0.22.1, 0.25.1, 0.26.0: the library loads and reshape_and_cache_flash writes K/V exactly, under
#     CUDA_MODULE_LOADING=EAGER and LAZY.
#   ALL_PY=1 (env): keep every vllm/*.py of the wheel instead of the listed ones (+ ~2.5-3 MB per archive), except
#     the list's 'omit' ones: for a release whose list is not yet known.
#   KERNELS (env, optional): keep device code only in containers whose cubin names a kernel containing this string
#     (e.g. reshape_and_cache_flash): the library then shrinks to about its host code (needs the zstd tool; not yet
#     run on a GPU).
# Unpack on the GPU host with scripts/gpu_live.sh.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '7,23p' "$0"; exit 2; }
release=$1
here=$(cd "$(dirname "$0")" && pwd)
files=${2:-$here/vllm-$release-files.txt}
wheels=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/dl" "vllm==$release"
whl=$(ls "$work"/dl/vllm-"$release"-*.whl)
mkdir -p "$work/tree/site312"
grep '^vllm/' "$files" > "$work/keep"
if [ "${ALL_PY:-}" = 1 ]; then
    sed -n 's/^omit //p' "$files" > "$work/omit"
    unzip -Z1 "$whl" | grep '^vllm/.*\.py$' | grep -vxF -f "$work/omit" | sort -u - "$work/keep" > "$work/all"
    mv "$work/all" "$work/keep"
fi
(cd "$work/tree" && unzip -q "$whl" "vllm-$release.dist-info/METADATA" $(cat "$work/keep"))

# The kernel library holding the cache-write op (its schema string is in the library that registers it).
op=
for lib in _C_stable_libtorch.abi3.so _C.abi3.so; do
    (cd "$work/tree" && unzip -q -o "$whl" "vllm/$lib" 2>/dev/null) || continue
    if grep -q "reshape_and_cache_flash(Tensor" "$work/tree/vllm/$lib"; then op=$lib; break; fi
    grep -qx "vllm/$lib" "$work/keep" || rm "$work/tree/vllm/$lib"
done
[ -n "$op" ] || { echo "vllm $release: no kernel library registers reshape_and_cache_flash" >&2; exit 1; }
echo "vllm $release: reshape_and_cache_flash is in vllm/$op"

for so in "$work"/tree/vllm/*.so; do
    strip --strip-unneeded "$so"
    python3 - "$so" "${SM:-90}" "${KERNELS:-}" <<'PY'
import struct, subprocess, sys

path, sm, needle = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
data = bytearray(open(path, "rb").read())
shoff, = struct.unpack_from("<Q", data, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
names_at = sections[shstrndx][4]
fatbin = [s for s in sections if data[names_at + s[0]:].split(b"\0", 1)[0] == b".nv_fatbin"]
if not fatbin:
    sys.exit(0)
p, end = fatbin[0][4], fatbin[0][4] + fatbin[0][5]
before = after = emptied = 0


def names_kernel(entry):
    body = entry[struct.unpack_from("<I", entry, 4)[0]:]
    if body[:4] == b"\x28\xb5\x2f\xfd":  # zstd-compressed image; zstd exits 1 on the zero padding after the frame
        body = subprocess.run(["zstd", "-dcq"], input=body, capture_output=True).stdout
    return needle in body


while p < end:
    if data[p:p + 4] != b"\x50\xed\x55\xba":  # fatbin container magic; containers are 8-aligned
        p += 8
        continue
    _, _, hsize, fsize = struct.unpack_from("<IHHQ", data, p)
    q, cend, kept = p + hsize, p + hsize + fsize, []
    while q < cend:
        kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, q)
        arch, = struct.unpack_from("<I", data, q + 28)
        if kind == 2 and arch == sm:  # an ELF cubin for this SM (sm_90 and sm_90a both say 90)
            kept.append(bytes(data[q:q + ehsize + psize]))
        q += ehsize + psize
    if q != cend:
        sys.exit(f"{path}: malformed fatbin container at {p:#x}")
    if needle and not any(names_kernel(e) for e in kept):
        kept = []
    body = b"".join(kept)
    data[p + hsize:cend] = body + bytes(fsize - len(body))
    struct.pack_into("<Q", data, p + 8, len(body))
    before, after, emptied, p = before + fsize, after + len(body), emptied + (not body), cend
open(path, "wb").write(data)
print(f"{path.split('/tree/')[-1]}: device code {before:,} -> {after:,} bytes (sm_{sm} cubins"
      f"{', kernels naming ' + needle.decode() if needle else ''}; {emptied} containers emptied)")
PY
done

pips=$(sed -n 's/^pip //p' "$files")
extra=()
[ -n "$wheels" ] && extra=("$wheels"/*.whl)
if [ -n "$pips" ] || [ ${#extra[@]} -gt 0 ]; then
    python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$work/tree/site312" $pips "${extra[@]}" 2>&1 |
        grep -v "Running pip as the 'root' user" || true
fi
rm -rf "$work/tree/site312/bin"
find "$work/tree/site312" -name "*.so*" -type f -exec strip --strip-unneeded {} +
cp "$here/gpu_lane_stubs.py" "$work/tree/site312/sitecustomize.py"

mkdir -p .vllm-slim
out=.vllm-slim/vllm-$release-slim.tar.xz
tar -C "$work/tree" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - \
    "vllm-$release.dist-info" vllm site312 | xz -9e -T1 > "$out"
echo "$out: $(stat -c %s "$out") bytes ($(find "$work/tree/vllm" -name '*.py' | wc -l) vllm .py files, vllm/$op," \
     "site312: $(ls "$work/tree/site312" | grep -c dist-info) wheels)"
