"""vllm-write: K/V written by vLLM's own CUDA cache-write op land exactly where the release's contract says, and
nowhere else.

Needs a CUDA device and vLLM installed (a live session); anywhere else each target is reported as skipped, with
the reason, never as passed.
"""


from __future__ import annotations

import importlib
import importlib.util

import torch

from harness import checks
from harness.checks.outcome import Outcome, compare
from harness.contract import views
from harness.handed.cache import read
from harness.results import Word
from harness.run.implementation import Implementation
from harness.run.targets import Target
from harness.run.trial import Trial


def _skip_reason():
    if not torch.cuda.is_available():
        return "vLLM's cache-write op needs a CUDA device; none here"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (contracts replayed): its cache-write op is not available"
    return None


def _write_op():
    # The op lives in the release's kernel library: vllm._C up to the 0.2x releases, vllm._C_stable_libtorch after.
    # Load it directly: vllm only does so once its platform resolves to CUDA (seen on H200 with vLLM 0.26.0: the
    # op namespace stayed empty after importing vllm._custom_ops alone).
    for library in ("vllm._C", "vllm._C_stable_libtorch"):
        if importlib.util.find_spec(library) is not None:
            importlib.import_module(library)
    return torch.ops._C_cache_ops.reshape_and_cache_flash


def _scales(op, device):
    # k_scale/v_scale were floats in older releases and are 1-element tensors in newer ones: follow the schema.
    kinds = {a.name: str(a.type) for a in op.default._schema.arguments}
    one = torch.ones(1, dtype=torch.float32, device=device) if kinds.get("k_scale") == "Tensor" else 1.0
    return one, one


def skipped(target: Target) -> str | None:
    """Why vLLM's cache-write op cannot be checked on `target` here (None when it can)."""
    reason = _skip_reason()
    # reshape_and_cache_flash writes the caches whose rows are values alone (per-tensor fp8 quantised with the
    # scale, 1 here); caches with inline or block scales are written by other kernels.
    if not reason and not target.contract.dtype.values_only:
        reason = f"vLLM writes a {target.contract.cache_dtype} cache with another kernel than reshape_and_cache_flash"
    # Its one head size is K's and V's; the diff-KV backends write K and V of their own head sizes with theirs.
    if not reason and target.contract.diff_kv:
        reason = "vLLM writes a diff-KV cache with triton_reshape_and_cache_flash_diffkv, not reshape_and_cache_flash"
    if reason or target.release.source != "live":
        return reason or "contracts replayed from a fixture: the installed vLLM is not this release"
    return None


class VllmWrite(Implementation):
    def body(self, t: Trial) -> Outcome:
        ex = t.example
        dtype, device, c = ex.case.torch_dtype, t.device, ex.contract
        _, k, v = ex.case.inputs(device)
        kv_cache = views.allocate(c, ex.dims, dtype, device)
        keys, values = views.split(c, kv_cache, ex.dims)
        pages = ex.paging().to(device)
        op = _write_op()
        raw = (keys, values) if c.dtype.element is None else (keys.view(c.dtype.element), values.view(c.dtype.element))
        try:
            op(k, v, *raw, pages.slot_mapping, c.cache_dtype, *_scales(op, device))
            torch.cuda.synchronize()
        except Exception as e:
            return Outcome(Word.CONTRACT_ERROR, f"vLLM's reshape_and_cache_flash refused the contract's K/V views "
                                                f"{tuple(keys.shape)} strides {keys.stride()}: {type(e).__name__}: {e}")
        got_k, got_v = read(keys, values, pages)
        for name, got, want in (("K", got_k, c.dtype.stored(k)), ("V", got_v, c.dtype.stored(v))):
            o = compare(got, want, f"{name} read back through the contract's view")
            if o.word != "bit-identical":
                return o
        # Nothing else written: every other element of the whole allocation (other layers, spare pages) is still poison.
        whole = torch.empty(0, dtype=keys.dtype, device=device).set_(kv_cache.untyped_storage()).float()
        written, expected = int((~whole.isnan()).sum()), 2 * k.numel()
        if written != expected:
            return Outcome(Word.DIFFERS, f"{written} elements of the allocation hold values after the write, "
                                         f"expected exactly the {expected} of K and V")
        return Outcome(Word.BIT_IDENTICAL)


IMPLEMENTATION = VllmWrite(checks.VLLM_WRITE)
