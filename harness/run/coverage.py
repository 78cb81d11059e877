"""What a run checks of each release and what it leaves out, said in the run's header and summary, and in
not-applicable lines for what no item takes."""

from __future__ import annotations

from dataclasses import replace

from harness import checks
from harness.checks import Check
from harness.contract import Contract
from harness.results import Word
from harness.results.words import count, listed
from harness.run import implementation
from harness.run.session import NOMINAL, Session
from harness.run.targets import examples_per_item, geometries, in_models, outside
from harness.subjects import FORWARD


def takes_geometries(session: Session) -> bool:
    """Whether a check the subject has the capabilities for hands it one geometry's cache (split, transfer, the
    kernel checks); a connector's check hands it whole models instead."""
    return any(c.hands_cache for c in taken(session))


def taken(session: Session) -> list[Check]:
    """The checks with a suite that the subject has the capabilities for, in the declarations' order."""
    return [c for c in checks.CHECKS if c.module and not session.missing(c.needs)]


def coverage(session: Session) -> list[str]:
    """Per release, what this run checks of it and what it leaves out, with counts and why, for the checks the
    subject takes: of its recorded contracts (the backends and cache dtypes asked for, the subject's own `backends`,
    caches no K/V check takes, what its supports_layer refuses) where a check hands it a geometry's cache, then what
    each check that takes its own targets says of them (a connector's models); then the checks the subject declares
    no capability for."""
    s = session
    out = geometry_coverage(s) if takes_geometries(s) else []
    for c in taken(s):
        out += implementation.of(c).covered(s)
    lacking = [c.name for c in checks.CHECKS if c.module and c.needs and s.missing(c.needs)]
    if lacking:
        out.append(f"{s.subject_name} declares {', '.join(sorted(s.capabilities))}: {', '.join(lacking)} "
                   "need more (one not-applicable line per release each)")
    return out


def geometry_coverage(session: Session) -> list[str]:
    """Per release, what of its recorded contracts this run checks and what it leaves out, with counts and why."""
    s = session
    served = getattr(s.subject, "backends", None)
    out = []
    for r in s.releases:
        left: dict[str, list[Contract]] = {}
        for c in r.contracts:
            b = c.origin.backend_name
            why = ("not asked for (--kvconform-backend)" if s.backends and b not in s.backends else
                   f"not among the backends {s.subject_name} names ({', '.join(served)})"
                   if served is not None and b not in served else
                   "cache dtype not asked for (--kvconform-cache-dtype)"
                   if s.cache_dtypes and c.cache_dtype not in s.cache_dtypes else "")
            if why:
                left.setdefault(why, []).append(c)
        chosen = dict.fromkeys(t.contract for t in geometries(s) if t.release is r)
        refused: dict[str, list[str]] = {}
        for c in chosen:
            # A diff-KV geometry is asked at the head sizes its examples draw (V narrower and wider than K): a
            # subject may refuse V's own head size alone.
            asked = ([replace(NOMINAL, head_dim=k, head_dim_v=v) for k, v in s.sizes.diff_kv_dims] if c.diff_kv
                     else [NOMINAL])
            reason = next((why for dims in asked if (why := s.supports(r, c, dims))), None)
            if reason:
                refused.setdefault(reason, []).append(c.name)
        checked = sum(1 for c in r.contracts if s.selects(c))
        parts = [f"{count(len(cs), 'contract')} of {_count_by(c.origin.backend_name for c in cs)}: {why}"
                 for why, cs in left.items()]
        parts += [f"{count(len(names), 'geometry')} ({listed(names)}): {reason}"
                  for reason, names in left_out(s, r).items()]
        parts += [f"{count(len(names), 'geometry')} ({listed(names)}): unsupported, by its supports_layer: "
                  f"{reason}" for reason, names in refused.items()]
        if r.unmodelled:
            parts.append("cache dtypes its backends list that kvconform does not model (no contract recorded): "
                         + ", ".join(f"{d} ({', '.join(bs)})" for d, bs in r.unmodelled.items()))
        line = (f"{r.release}: {s.subject_name} selects {checked} of its {len(r.contracts)} contracts "
                f"({count(len(chosen), 'geometry')})")
        line += "; not checked: " + "; ".join(parts) if parts else "; every one is checked"
        layers = [f"{t.geometry}" + (f" (also {', '.join(t.also)})" if t.also else "") + f" at {len(t.views)} sizes"
                  for t in in_models(s) if t.release is r]
        out.append(line + (f"; and {count(len(layers), 'model layer')} handed views no contract has: "
                           f"{', '.join(layers)}" if layers else ""))
    return out


def left_out(session: Session, r) -> dict[str, list[str]]:
    """The selected geometries of release `r` that no K/V check of this subject takes, by why (none when the subject
    takes no check of a geometry's cache)."""
    if not takes_geometries(session):
        return {}
    kernels = FORWARD in session.capabilities
    why: dict[str, list[str]] = {}
    for c in dict.fromkeys(c for c in r.contracts if session.selects(c)):
        reason = outside(c, session.sizes) or outside(c, session.sizes, kernels)
        if reason:
            why.setdefault(reason, []).append(c.name)
    return why


def plan(session: Session, max_examples: int) -> str:
    """The examples each item gets per check in this session, as the items will draw them."""
    sample = next(iter(geometries(session)), None)
    said = [implementation.of(c).planned(session, examples_per_item(c, max_examples, c.mode), sample)
            for c in taken(session)]
    return "; ".join(filter(None, said))


def record_not_applicable(session: Session, check: Check) -> int:
    """One not-applicable line per session release for a check the subject lacks capabilities for (never a pass,
    never a finding). Returns how many lines were written."""
    why = (f"{session.subject_name} declares {', '.join(sorted(session.capabilities))}; {check.name} needs "
           f"{', '.join(sorted(check.needs))} (missing {', '.join(session.missing(check.needs))})")
    for r in session.releases:
        session.sink.write(r, "*", check.name, "*", Word.NOT_APPLICABLE, why)
    return len(session.releases)


def record_outside(session: Session) -> int:
    """One not-applicable line per release for the selected geometries no K/V check covers, saying why."""
    n = 0
    for r in session.releases:
        why = left_out(session, r)
        if why:
            text = "; ".join(f"{len(names)} geometries ({', '.join(names)}): {reason}" for reason, names in why.items())
            session.sink.write(r, "*", checks.KV_CHECKS.name, "*", Word.NOT_APPLICABLE, text)
            n += 1
    return n


def _count_by(names) -> str:
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{n} ({k})" for n, k in counts.items())
