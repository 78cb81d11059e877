"""The subject's dense forward agrees with the float64 oracle (harness.reference) at a stated tolerance.

Tolerance |out - oracle| <= 2 * eps(dtype) * max|v|, elementwise. Why: q, k, v are the same rounded inputs for
both, scores and softmax sums are fp32 (error ~1e-7, far below), so what remains is (1) the unnormalised
probabilities p in (0, 1] rounded to the input dtype before the PV product, a relative error <= eps/2 on each
weight, so <= eps/2 * max|v| on the output (fp16 subnormals add at most kv_len * 2^-25 * max|v|, under eps/4 *
max|v| for kv_len <= 8k), and (2) the output's own rounding, <= eps/2 * |out| <= eps/2 * max|v|. That bounds the
error by eps * max|v|; the factor 2 is margin, still tight enough that one wrong key weight shows (a mask or
mapping bug moves outputs by O(|v|), i.e. hundreds of eps).
"""

import torch

from harness import reference

CHECK = "oracle"


def tolerance(dtype: torch.dtype, v: torch.Tensor) -> float:
    return 2 * torch.finfo(dtype).eps * float(v.abs().max())


def check(run, ex, _):
    q, k, v = ex.case.inputs(run.device)
    tile = run.call(run.subject.tile_config, ex.case)
    out = run.call(run.subject.dense_forward, ex.case, q, k, v, tile)
    expected = reference.attention(ex.case, q, k, v, tile.block_n)
    if out.shape != expected.shape:
        return run.outcome("differs", f"output shape {tuple(out.shape)}, oracle {tuple(expected.shape)}")
    err = (out.double() - expected).abs()
    err[out.isnan()] = float("inf")
    tol = tolerance(ex.case.torch_dtype, v)
    worst = int(err.argmax())
    at = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), err.shape))
    if float(err.max()) <= tol:
        return run.outcome("within-tolerance")
    return run.outcome("differs", f"dense vs float64 oracle: max abs error {float(err.max()):g} at (token, head, dim) "
                                  f"{at} > tolerance {tol:g} (2 * eps({ex.case.dtype}) * max|v|), "
                                  f"{int((err > tol).sum())} of {err.numel()} elements over")


def test_oracle(conformance, dense_target):
    conformance.run(dense_target, CHECK, check)


def test_oracle_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
