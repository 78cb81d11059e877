"""Stand-in backend classes and layout functions of one recorded release, built from its recording: the recorded
surface gives the names, kinds and signatures (a method the release lacks is absent; an argument it lacks is a
TypeError, as `inspect.Signature.bind` says it), the recording's model gives the answers.

How each answer is computed:
- `get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size[, cache_dtype_str])`: the backend's contract
  logical axes (harness.contract) sized at the arguments, each side's stored width by the rule of `WIDTHS` that
  reproduces every answer the release gave for that cache dtype string; a block size the release refuses (the
  multiple its recorded answers accept and refuse) raises the release's exception type. A cache dtype string the
  release was not asked about, or whose answers no width rule reproduces, raises CannotAnswer.
- answers over a finite domain (`get_kv_cache_stride_order` under each VLLM_KV_CACHE_LAYOUT setting with and
  without the layers dimension, `supported_kv_cache_layouts()` per device class, `get_name()`, MLA flags,
  `get_kv_cache_layout()`, KVCacheLayout's properties) are the recorded ones; a point of the domain that was not
  recorded raises CannotAnswer, and a recorded refusal is raised again with its type (text prefixed REPLAY).
- spec and view builders (`customize_spec`, `create_kv_cache_views`, `compute_layout_strides`) take vLLM's spec
  objects, which the recording does not model: they raise CannotAnswer.
"""

from __future__ import annotations

import ast
import builtins
import enum
import functools
import inspect
import math
import os
from collections.abc import Callable
from typing import Any

from harness.backends import LAYOUT_ENV
from harness.contract import Contract
from harness.recordings import store
from harness.recordings.store import Recording
from harness.vllm_api.surface import Api, ApiError, BackendApi, Member

# Stored width of one side per token and head, by rule name; a rule is chosen per (backend, cache dtype string) by
# the recorded answers, never by the string's name.
WIDTHS: dict[str, Callable[[int], int]] = {
    "head": lambda d: d,  # model dtype, per-tensor fp8
    "head+scale": lambda d: d + 4,  # 1-byte values + an inline fp32 scale (fp8/int8 per token-head)
    "half+scale": lambda d: d // 2 + 4,  # two int4 per byte + an inline fp32 scale
    "nvfp4": lambda d: d // 2 + d // 16,  # packed fp4 + one fp8 scale per 16 values
}


class CannotAnswer(RuntimeError):
    """The recording's model cannot answer this call as the release would (never a guess). Not a
    NotImplementedError: consumers read that one as a release's "no stride order" (vLLM's model runner does)."""


class Refused(Exception):
    """Base of every recorded refusal a stand-in raises again (beside the release's own exception type)."""


def decode(x: Any, enums: dict[str, type[enum.Enum]], classes: dict[str, type]) -> Any:
    """A recorded answer as the release's value, enum members and classes as the stand-ins' own."""
    if isinstance(x, list):
        return [decode(v, enums, classes) for v in x]
    if isinstance(x, dict):
        if "tuple" in x:
            return tuple(decode(v, enums, classes) for v in x["tuple"])
        if "enum" in x:
            cls, member = x["enum"].split(".")
            if cls not in enums:
                raise CannotAnswer(f"the answer names {x['enum']}, but the recording has no {cls} enum")
            return enums[cls][member]
        if "class" in x:
            if x["class"] not in classes:
                raise CannotAnswer(f"the answer is class {x['class']}, which the stand-ins do not hold")
            return classes[x["class"]]
    return x


def refusal(release: str, raised: list[str]) -> Exception:
    """The release's recorded refusal as an exception of the same builtin type (RuntimeError where it was vLLM's
    own type), text prefixed REPLAY."""
    name, text = raised
    base = getattr(builtins, name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = RuntimeError
    cls = type(name, (base, Refused), {"__module__": "harness.vllm_api.replay"})
    return cls(f"REPLAY of vLLM {release}: {text}")


class _Text:
    """An annotation kept as its recorded text: inspect prints it back verbatim (it is never evaluated)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def parse_signature(text: str | None, where: str) -> inspect.Signature:
    """The recorded signature text as an inspect.Signature whose text is the recorded one (annotations kept as
    text; defaults must be literals)."""
    if text is None:
        raise ApiError(f"{where}: no signature recorded")
    src = f"def f{text}: pass"
    try:
        fn = ast.parse(src).body[0]
    except SyntaxError as e:
        raise ApiError(f"{where}: recorded signature {text!r} does not parse: {e}") from None
    a = fn.args
    ann = lambda node: inspect.Parameter.empty if node is None else _Text(ast.get_source_segment(src, node))  # noqa: E731
    P = inspect.Parameter
    params = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=_literal(default, src, where), annotation=ann(arg.annotation)))
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL, annotation=ann(a.vararg.annotation)))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=_literal(default, src, where), annotation=ann(arg.annotation)))
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD, annotation=ann(a.kwarg.annotation)))
    return inspect.Signature(params, return_annotation=ann(fn.returns))


def _literal(node: ast.expr | None, src: str, where: str) -> Any:
    if node is None:
        return inspect.Parameter.empty
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ApiError(f"{where}: recorded default {ast.get_source_segment(src, node)!r} is not a literal") from None


class _Shapes:
    """The get_kv_cache_shape model of one backend: logical axes from its contracts, a width rule per cache dtype
    string and the block-size multiple, all reproducing every recorded answer."""

    def __init__(self, release: str, b: BackendApi, contracts: list[Contract], sig: inspect.Signature):
        self.release, self.name = release, b.name
        self.default_dtype = sig.parameters["cache_dtype_str"].default if "cache_dtype_str" in sig.parameters else None
        answers = [self._args(a, sig) for a in b.answers_to("get_kv_cache_shape")]
        logicals = list(dict.fromkeys(c.layout.logical for c in contracts))
        self.diff_kv = any(c.diff_kv for c in contracts)
        took = [(args, a) for args, a in answers if "result" in a]
        refused = [(args, a) for args, a in answers if "raises" in a]
        self.multiple, self.block_refusal = self._block_rule(took, refused)
        self.rules: dict[str, tuple[tuple[str, ...], str] | list[str] | None] = {}
        for dtype in dict.fromkeys(args["cache_dtype_str"] for args, _ in answers):
            mine = [(args, a) for args, a in answers if args["cache_dtype_str"] == dtype
                    and args["block_size"] % self.multiple == 0]
            self.rules[dtype] = self._fit(logicals, mine)

    def _args(self, a: dict[str, Any], sig: inspect.Signature) -> tuple[dict[str, Any], dict[str, Any]]:
        bound = sig.bind(*a["args"], **a["kwargs"])
        bound.apply_defaults()
        args = dict(bound.arguments)
        args.setdefault("cache_dtype_str", self.default_dtype)
        args["head_size_v"] = (a.get("state") or {}).get("head_size_v")
        return args, a

    def _block_rule(self, took, refused) -> tuple[int, list[str] | None]:
        sizes = {args["block_size"] for args, _ in took}
        bad = {args["block_size"]: a["raises"] for args, a in refused}
        if not bad:
            return 1, None
        m = functools.reduce(math.gcd, sizes)
        if any(bs % m == 0 for bs in bad):
            return 1, None  # refusals that are not a block-size rule: left to the per-dtype fit
        return m, next(iter(bad.values()))

    def shape(self, args: dict[str, Any], logical: tuple[str, ...], rule: str) -> tuple[int, ...]:
        w = WIDTHS[rule]
        hd, hv = args["head_size"], args.get("head_size_v")
        if self.diff_kv and hv is None:
            raise CannotAnswer(f"{self.name}.head_size_v is None: a diff-KV shape needs V's head size")
        c = w(hd) + (w(hv) if self.diff_kv else w(hd))
        sizes = {"B": args["num_blocks"], "KV": 2, "N": args["block_size"], "H": args["num_kv_heads"],
                 "S": 2 * args["num_kv_heads"], "D": w(hd), "C": c, "R": w(hd)}
        return tuple(sizes[a] for a in logical)

    def _fit(self, logicals, answers) -> tuple[tuple[str, ...], str] | list[str] | None:
        if not answers:
            return None
        if all("raises" in a for _, a in answers) and len({a["raises"][0] for _, a in answers}) == 1:
            return answers[0][1]["raises"]  # the release refuses this cache dtype at every size
        for logical in logicals:
            for rule in WIDTHS:
                try:
                    if all("result" in a and self.shape(args, logical, rule) == tuple(a["result"]["tuple"])
                           for args, a in answers):
                        return logical, rule
                except CannotAnswer:
                    continue
        return None

    def __call__(self, cls: type, args: dict[str, Any]) -> tuple[int, ...]:
        dtype = args.get("cache_dtype_str", self.default_dtype)
        if self.multiple > 1 and args["block_size"] % self.multiple:
            raise refusal(self.release, self.block_refusal)
        if dtype not in self.rules:
            raise CannotAnswer(f"REPLAY of vLLM {self.release}: {self.name}.get_kv_cache_shape was not recorded "
                               f"for cache_dtype_str={dtype!r} (recorded: {', '.join(map(repr, self.rules))})")
        rule = self.rules[dtype]
        if rule is None:
            raise CannotAnswer(f"REPLAY of vLLM {self.release}: no layout model reproduces {self.name}'s recorded "
                               f"get_kv_cache_shape answers for cache_dtype_str={dtype!r}")
        if isinstance(rule, list):
            raise refusal(self.release, rule)
        return self.shape({**args, "head_size_v": getattr(cls, "head_size_v", None)}, *rule)


def _finite(release: str, what: str, answers: list[dict[str, Any]], sig: inspect.Signature | None,
            decode_: Callable[[Any], Any]) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    """An answer over a finite domain: the recorded one for these (bound) arguments and conditions."""
    table: dict[str, dict[str, Any]] = {}
    for a in answers:
        table[_key(_bound(sig, a["args"], a["kwargs"]), {k: a.get(k) for k in ("env", "device") if k in a})] = a

    def answer(args: dict[str, Any], where: dict[str, Any]) -> Any:
        a = table.get(_key(args, where))
        if a is None:
            raise CannotAnswer(f"REPLAY of vLLM {release}: {what} was not recorded for arguments {args} under "
                               f"{where or 'no condition'}")
        if "raises" in a:
            raise refusal(release, a["raises"])
        return decode_(a["result"])

    return answer


def _bound(sig: inspect.Signature | None, args: list, kwargs: dict) -> dict[str, Any]:
    if sig is None:
        return {}
    b = sig.bind(*args, **kwargs)
    b.apply_defaults()
    return dict(b.arguments)


def _key(args: dict[str, Any], where: dict[str, Any]) -> str:
    return repr((sorted(args.items()), sorted(where.items())))


def layout_setting() -> str | None:
    """The VLLM_KV_CACHE_LAYOUT setting a stand-in answers under: the environment's, read at each call (vLLM reads
    it once per process through a cache; replay serves one setting per call instead)."""
    return os.environ.get(LAYOUT_ENV)


class StandIns:
    """One release's stand-ins: enums, backend classes and layout functions, built once per recording."""

    def __init__(self, api: Api, contracts: tuple[Contract, ...], device: str | None = None):
        self.api, self.release, self.device = api, api.release, device
        self.enums: dict[str, type[enum.Enum]] = {}
        self.classes: dict[str, type] = {}  # stand-in classes by name, for answers that are classes
        self._backends: dict[str, type] = {}
        for mod, body in api.modules.items():
            for n, spec in ((body or {}).get("names") or {}).items():
                if spec["kind"] == "enum":
                    self.enums[n] = self._enum(n, spec)
        self.contracts = contracts

    def decode(self, x: Any) -> Any:
        return decode(x, self.enums, self.classes)

    def _enum(self, name: str, spec: dict[str, Any]) -> type[enum.Enum]:
        members = {m: self.decode(v) for m, v in spec["members"].items()}
        cls = enum.Enum(name, members, module=f"vllm (REPLAY of {self.release})")
        for prop, per_member in spec["properties"].items():
            setattr(cls, prop, property(lambda self, _t=per_member: decode(_t[self.name], {}, {})))
        cls.__doc__ = f"REPLAY stand-in for vLLM {self.release}'s {name}: the recorded members and properties"
        return cls

    def backend(self, name: str) -> type:
        """The stand-in of backend `name` (kvconform's name, e.g. FLASH_ATTN): exactly its recorded layout members;
        one class per backend, as a release has, whether it is imported or handed to a layer."""
        if name not in self._backends:
            self._backends[name] = self._backend(name)
        return self._backends[name]

    def _backend(self, name: str) -> type:
        b = self.api.backend(name)
        mine = [c for c in self.contracts if c.origin.backend_name == name]
        holder: dict[str, type] = {}  # the class itself: a diff-KV shape reads the class's head_size_v
        attrs: dict[str, Any] = {"__doc__": f"REPLAY stand-in for vLLM {self.release}'s {b.cls}: its layout API as "
                                            f"recorded, answering from the recording's model",
                                 "__module__": b.module}
        for m in b.members.values():
            attrs[m.name] = self._member(b, m, mine, holder)
        holder["cls"] = cls = type(b.cls, (), attrs)
        return cls

    def _member(self, b: BackendApi, m: Member, contracts: list[Contract], holder: dict[str, type]) -> Any:
        where = f"vLLM {self.release} {b.cls}.{m.name}"
        if m.kind == "value":
            return self.decode(m.value)
        if m.kind == "property":
            def unmodelled(_self):
                raise CannotAnswer(f"REPLAY: {where} is a property replay does not model")

            return property(unmodelled)
        sig = parse_signature(m.signature, where)
        impl = self._impl(b, m, sig, contracts, where, holder)

        def call(*args, **kwargs):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{m.name}() {e}") from None
            bound.apply_defaults()
            return impl(dict(bound.arguments))

        call.__name__ = call.__qualname__ = m.name
        call.__doc__ = f"REPLAY stand-in for {where}{m.signature}"
        if m.kind != "classmethod":
            call.__signature__ = sig
            return staticmethod(call)

        def method(cls, *args, **kwargs):
            return call(*args, **kwargs)

        method.__name__ = method.__qualname__ = m.name
        method.__doc__ = call.__doc__
        first = inspect.Parameter("cls", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        method.__signature__ = sig.replace(parameters=[first, *sig.parameters.values()])
        return classmethod(method)

    def _impl(self, b: BackendApi, m: Member, sig: inspect.Signature, contracts: list[Contract], where: str,
              holder: dict[str, type]) -> Callable[[dict[str, Any]], Any]:
        release, recorded = self.release, b.answers_to(m.name)
        if m.name == "get_kv_cache_shape":
            shapes = _Shapes(release, b, contracts, sig)
            return lambda args: shapes(holder["cls"], args)
        if m.name == "get_impl_cls":
            impl_name = b.cls.removesuffix("Backend") + "Impl"

            def impl_cls(args):
                if impl_name not in self.classes:
                    raise CannotAnswer(f"REPLAY of vLLM {release}: {where} names {impl_name}, which replay lacks")
                return self.classes[impl_name]

            return impl_cls
        if recorded:
            conditions = {k for a in recorded for k in ("env", "device") if k in a}
            answer = _finite(release, where, recorded, sig, self.decode)

            def finite(args):
                now = {}
                if "env" in conditions:
                    now["env"] = layout_setting()
                if "device" in conditions:
                    now["device"] = self.device
                return answer(args, now)

            return finite

        def unmodelled(args):
            raise CannotAnswer(f"REPLAY of vLLM {release}: {where} takes vLLM's own objects (specs, tensors), which "
                               "the recording does not model")

        return unmodelled

    def function(self, module: str, name: str) -> Callable[..., Any]:
        """A module-level layout function of the release (get_kv_cache_layout, create_kv_cache_views, ...)."""
        body = self.api.modules.get(module) or {}
        spec = (body.get("names") or {}).get(name)
        if spec is None:
            raise ApiError(f"vLLM {self.release} has no {module}.{name}")
        where = f"vLLM {self.release} {module}.{name}"
        sig = parse_signature(spec.get("signature"), where)
        recorded = [a for a in body.get("answers", []) if a["call"] == name]
        answer = _finite(self.release, where, recorded, sig, self.decode) if recorded else None

        def fn(*args, **kwargs):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{name}() {e}") from None
            bound.apply_defaults()
            if answer is None:
                raise CannotAnswer(f"REPLAY of vLLM {self.release}: {where} takes vLLM's own objects (specs, "
                                   "tensors), which the recording does not model")
            return answer(dict(bound.arguments), {"env": layout_setting()})

        fn.__name__ = fn.__qualname__ = name
        fn.__signature__ = sig
        fn.__doc__ = f"REPLAY stand-in for {where}{spec.get('signature')}"
        fn.__module__ = module
        return fn


def api_of(recording: Recording) -> Api:
    """The recorded layout API of `recording`; ApiError when it has none (an old recording)."""
    return Api.from_json(recording.release, recording.api, f"the recording of vLLM {recording.release} "
                         f"({store.path(recording.release)})")


_cache: dict[tuple[int, str | None], StandIns] = {}
_tokens: dict[tuple, int] = {}  # what a recording's stand-ins are built from -> its token
_known: dict[int, tuple[Recording, int]] = {}  # id(recording) -> (it, kept alive; its token)


def token(recording: Recording) -> int:
    """A small key for what `recording`'s stand-ins are built from (its release, contracts and API): equal for
    recordings that build the same stand-ins. Those hold all its contracts, and a tuple does not keep its hash, so it
    is hashed once per recording rather than on every replayed call."""
    known = _known.get(id(recording))
    if known is None:
        content = (recording.release, recording.contracts, id(recording.api))
        known = _known[id(recording)] = (recording, _tokens.setdefault(content, len(_tokens)))
    return known[1]


def stand_ins(recording: Recording, device: str | None = None) -> StandIns:
    """`recording`'s stand-ins (built once per recording and device class)."""
    key = (token(recording), device)
    if key not in _cache:
        _cache[key] = StandIns(api_of(recording), recording.contracts, device)
    return _cache[key]
