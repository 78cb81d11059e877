"""Blocks the subject extracts from one cache and injects into a fresh cache of the same contract at other block ids
hold exactly the same K and V there, and nothing else of the target allocation changed (its other pages and other
layers still poisoned); extract leaves the source as it was. For KV offloaders and connectors, which move blocks
through their own views of the cache. Between extract and inject the source blocks are reused (poisoned again): a
payload must own its data, as an offloaded block's must.

Every geometry runs the explicit examples of harness.transfer first (num_blocks 2 and 3, where the block axis is as
long as a K/V axis), then generated ones, half of them at 2 or 3 pages.
"""

from harness import checks, transfer

CHECK = checks.TRANSFER  # its declaration: what it needs, costs and draws


def check(t):
    return transfer.moved(t, t.example.contract, t.layer)  # the target: another layer of the same layout


def test_transfer(conformance, target):
    conformance.run(target, CHECK, check)


def test_transfer_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
