"""rejects-malformed: a malformed kv_cache given to the subject's split is refused: the split raises an exception, of
any type, whose message names the tensor's full shape, spelled as a tuple `(2, 3, 16, 2, 64)`, a `torch.Size([2, 3, 16,
2, 64])` or a list `[2, 3, 16, 2, 64]`; kvconform's own ContractError names the expected contract too. A split that
returns, or raises naming no shape, accepted it. An example is malformed in every way that shows at its sizes (a stored
regression in the one way it was found); what an example costs is drawing it, and each way is one more call."""

from __future__ import annotations

from harness import checks
from harness.checks.outcome import Outcome
from harness.checks.split import Viewed
from harness.contract import ContractError, views
from harness.draws.strategies import MALFORMATIONS
from harness.handed.layer import in_force
from harness.results import Word
from harness.run.trial import Trial

# Each malformation (harness.draws.strategies.MALFORMATIONS) breaks the contract in a way that is visible without
# knowing the sizes (the layer value holds the sizes; a malformation must not look like another valid cache).


def malform(kv_cache, contract, mutation):
    axis = {a: i for i, a in enumerate(contract.layout.logical)}
    if mutation == "extra-axis":
        return kv_cache.unsqueeze(0)
    if mutation == "bad-kv-or-c-size":
        if contract.layout.split_axis in ("C", "S"):  # an odd packed or head-slot axis: K and V cannot be halves of it
            split = axis[contract.layout.split_axis]
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
        if ex.within is not None:  # a copy of a model's view in the contract's order is a cache the release hands
            return False
        long = [a for a in ex.contract.layout.logical if views.size(ex.contract, a, ex.dims) > 1]
        return [a for a in ex.contract.layout.physical if a in long] != long
    if mutation == "swapped-n-h":
        return ex.case.kv_heads > 1
    return True


def names_shape(message: str, shape: tuple[int, ...]) -> bool:
    """The message names `shape` in full, as a tuple, a torch.Size or a list."""
    return str(tuple(shape)) in message or str(list(shape)) in message


def refused(t, kv_cache, mutation):
    ex = t.example
    bad = malform(kv_cache, ex.contract, mutation)
    shape = tuple(bad.shape)
    try:
        with in_force(t.layer):
            t.subject.split(bad, t.layer)
    except Exception as e:
        wants = [] if names_shape(str(e), shape) else [f"the shape as {shape}, {list(shape)} or torch.Size({list(shape)})"]
        if isinstance(e, ContractError) and ex.contract.name not in str(e):
            wants.append(f"the contract {ex.contract.name}")
        if wants:
            return Outcome(Word.ACCEPTED, f"{mutation}: {type(e).__name__} raised without naming "
                                          f"{' and '.join(wants)}: {e}")
        return Outcome(Word.REJECTED)
    return Outcome(Word.ACCEPTED, f"{mutation}: split accepted kv_cache shape {shape} strides {bad.stride()}")


class RejectsMalformed(Viewed):
    def body(self, t: Trial) -> Outcome:
        ex = t.example
        kv_cache = t.allocate()  # each malformation makes its own tensor of it, a view or a copy
        if t.extra:  # a stored regression's one way, as it was found
            mutations = [t.extra if applicable(ex, t.extra) else "extra-axis"]
        else:
            mutations = [m for m in MALFORMATIONS if applicable(ex, m)]
        for mutation in mutations:
            outcome = refused(t, kv_cache, mutation)
            if not outcome.word.passing:
                return outcome
        return Outcome(Word.REJECTED)


IMPLEMENTATION = RejectsMalformed(checks.REJECTS_MALFORMED)
