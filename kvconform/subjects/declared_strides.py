"""A kernel pair over the views a whole model hands its layers: the built-in kernel launched with the strides its
layer's backend declares (`DeclaredStrides`: the shape and stride order vLLM's backend class states, allocated as
stated), as a kernel does that derives a block's base from what its layer says rather than from the tensor (ROCm
aiter PR #3498's split-K decode, vLLM #41472's ROCm decode slot); beside the built-in kernel as it is, which reads
`kv_cache.stride()` (`TensorStrides`). Where a release lays a layer's cache out as its contract does, both address
the same bytes; on a view a model hands with other strides (a hybrid model's FlashAttention layers up to vLLM 0.22:
blocks outside K/V), the first reads other layers' bytes and the other block's K or V.

    python -m pytest --pyargs kvconform.suites --kvconform-release 0.22.1 \\
        --kvconform-subject kvconform.subjects.declared_strides:DeclaredStrides -k bit_identity
"""

from __future__ import annotations

from harness.contract import views
from harness.handed.layer import contract_of, dims_of
from harness.subjects.builtin import BuiltinSubject


class DeclaredStrides(BuiltinSubject):
    """Splits as the built-in kernel does, then launches over K and V restrided as the layer's backend declares its
    cache (a launch with no split before it, the warm-up's, takes the views as given)."""

    name = "declared-strides"
    declared = None

    def split(self, kv_cache, layer):
        k, v = super().split(kv_cache, layer)
        c = contract_of(layer)
        stated = views.geometry(c, dims_of(c, kv_cache, layer), layer.dtype)
        start = kv_cache.storage_offset() - stated.kv_cache.offset  # where the stated allocation would begin
        self.declared = tuple((x.shape, x.stride, start + x.offset) for x in (stated.k, stated.v))
        return k, v

    def paged_launch(self, case, q, k_cache, v_cache, paging, tile):
        if self.declared is not None:
            (ks, kst, ko), (vs, vst, vo) = self.declared
            k_cache, v_cache = k_cache.as_strided(ks, kst, ko), v_cache.as_strided(vs, vst, vo)
        return super().paged_launch(case, q, k_cache, v_cache, paging, tile)


class TensorStrides(BuiltinSubject):
    """The built-in kernel: every stride from the tensors it is handed."""

    name = "tensor-strides"
