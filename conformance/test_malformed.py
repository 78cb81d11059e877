"""A malformed kv_cache given to the subject's split is refused: a ValueError (kvconform's ContractError is one)
whose message names the tensor's full shape, and for kvconform's own ContractError the expected layout too."""

from harness import checks
from harness.contract import ContractError
from harness.layer import in_force
from harness.results import Word

CHECK = checks.REJECTS_MALFORMED  # its declaration: what it needs, costs and draws
# Each malformation (harness.strategies.MALFORMATIONS) breaks the contract in a way that is visible without knowing
# the sizes (the layer value holds the sizes; a malformation must not look like another valid cache).


def malform(kv_cache, contract, mutation):
    axis = {a: i for i, a in enumerate(contract.logical)}
    if mutation == "extra-axis":
        return kv_cache.unsqueeze(0)
    if mutation == "bad-kv-or-c-size":
        if contract.split_axis in ("C", "S"):  # an odd packed or head-slot axis: K and V cannot be halves of it
            split = axis[contract.split_axis]
            return kv_cache.narrow(split, 0, kv_cache.shape[split] - 1)
        return kv_cache.repeat_interleave(2, dim=axis["KV"]).narrow(axis["KV"], 0, 3)
    if mutation == "strided-innermost":
        wide = kv_cache.repeat_interleave(2, dim=-1)
        return wide[..., ::2]
    if mutation == "ignored-physical-order":  # what a `.contiguous()` somewhere on the way does
        return kv_cache.contiguous()
    if mutation == "swapped-n-h":
        return kv_cache.transpose(axis["N"], axis["H" if "H" in axis else "S"])
    raise ValueError(mutation)


def applicable(ex, mutation):
    if mutation == "ignored-physical-order":  # only visible where axes longer than 1 change their memory order
        long = [a for a in ex.contract.logical if ex.contract.size(a, ex.dims) > 1]
        return [a for a in ex.contract.physical if a in long] != long
    if mutation == "swapped-n-h":
        return ex.case.kv_heads > 1
    return True


def check(run, ex, mutation):
    if not applicable(ex, mutation):
        mutation = "extra-axis"
    bad = malform(ex.contract.allocate(ex.dims, ex.case.torch_dtype, run.device), ex.contract, mutation)
    shape = str(tuple(bad.shape))
    layer = run.layer(ex)
    try:
        with in_force(layer):
            run.subject.split(bad, layer)
    except ValueError as e:
        named = (("shape", shape), ("contract", ex.contract.name)) if isinstance(e, ContractError) else (
            ("shape", shape),)
        missing = [what for what, text in named if text not in str(e)]
        if missing:
            return run.outcome(Word.ACCEPTED, f"{mutation}: {type(e).__name__} does not name the "
                                           f"{' or '.join(missing)} ({shape}, {ex.contract.name}): {e}")
        return run.outcome(Word.REJECTED)
    except Exception as e:
        return run.outcome(Word.SUBJECT_ERROR, f"{mutation}: raised {type(e).__name__} instead of a ValueError: {e}")
    return run.outcome(Word.ACCEPTED, f"{mutation}: split accepted kv_cache shape {shape} strides {bad.stride()}")


def test_rejects_malformed(conformance, target):
    conformance.run(target, CHECK, check)


def test_rejects_malformed_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
