"""hcc.ir.serialize — the plan file (``plan.json``): versioned JSON, documented in
docs/plan-format.md.

Terms
- plan file: one JSON object ``{"format": "hcc-plan", "version": 1, ...}`` holding every
  field of a :class:`~hcc.ir.plan.Plan`. Ops are compact arrays (an opcode, fixed fields, then
  the deps), so a 100k-op plan is a few MB rather than tens.
- canonical JSON: the plan's object without ``figures``, keys sorted, no whitespace. Its
  sha256 (first 16 hex digits) is :func:`digest`, the plan id frames on the wire carry.
  Figures (compile time, predictions) are excluded so that two compiles of one program, which
  differ only in their measured compile time, name the same schedule.

Every way a file can be wrong (not JSON, truncated, another format or version, a missing or
mistyped field, an op that does not decode, a plan that fails :func:`~hcc.ir.verify.verify`)
raises :class:`~hcc.ir.errors.PlanError` whose text starts ``<file>: error:``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from .errors import PlanError, VerifyError
from .files import atomic_write_text
from .plan import (
    PLAN_VERSION,
    ChunkRef,
    Copy,
    Figures,
    Plan,
    Recv,
    RecvReduce,
    Reduce,
    Scale,
    Send,
    Tree,
)
from .topology import Topology

FORMAT = "hcc-plan"
BUF_CODES = ("in", "out", "tmp")  # buffer code = index here
# opcode = index here; the order is part of format version 1 (docs/plan-format.md)
OPCODES = ("send", "recv", "recv_reduce", "copy", "reduce", "scale", "copy_roundtrip")
_MSG_TYPES = (Send, Recv, RecvReduce)

__all__ = ["FORMAT", "digest", "dumps", "load", "loads", "save", "summary", "to_dict"]


# -- encoding --------------------------------------------------------------------------------
def _buf(ref: ChunkRef) -> int:
    try:
        return BUF_CODES.index(ref.buf)
    except ValueError:
        raise PlanError(f"cannot write buffer {ref.buf!r} (expected one of {', '.join(BUF_CODES)})") from None


def _encode_op(op: Any) -> list:
    t = type(op)
    if t in _MSG_TYPES:
        ref = op.src if t is Send else op.dst
        return [_MSG_TYPES.index(t), op.peer, op.tag, _buf(ref), ref.offset, ref.count,
                op.tree, op.chunk, *op.deps]
    if t is Copy or t is Reduce:
        if op.src.count != op.dst.count:
            raise PlanError(f"cannot write {t.__name__.lower()} with unequal counts ({op.src.count}, {op.dst.count})")
        code = (6 if getattr(op, "roundtrip", False) else 3) if t is Copy else 4
        return [code, _buf(op.src), op.src.offset, _buf(op.dst), op.dst.offset,
                op.src.count, *op.deps]
    if t is Scale:
        return [5, _buf(op.dst), op.dst.offset, op.dst.count, op.divisor, *op.deps]
    raise PlanError(f"cannot write {op!r}: not a plan op")


def to_dict(plan: Plan, figures: bool = True) -> dict:
    """The plan as the JSON object of format version 1 (ops encoded, topology as a dict)."""
    d: dict[str, Any] = {
        "format": FORMAT,
        "version": PLAN_VERSION,
        "name": plan.name,
        "kind": plan.kind,
        "ranks": list(plan.ranks),
        "root": plan.root,
        "size_bytes": plan.size_bytes,
        "dtype": plan.dtype,
        "op": plan.op,
        "algorithm": plan.algorithm,
        "chunk_bytes": plan.chunk_bytes,
        "compress": plan.compress,
        "on_failure": plan.on_failure,
        "adaptive": plan.adaptive,
        "peers": plan.peers,
        "tmp_elems": list(plan.tmp_elems),
        "topology": plan.topology.to_dict(),
        "trees": [
            {"index": t.index, "root": t.root, "parent": list(t.parent), "rate": t.rate,
             "span": list(t.span), "paths": [list(p) for p in t.paths]}
            for t in plan.trees
        ],
    }
    if figures:
        d["figures"] = dataclasses.asdict(plan.figures)
    d["programs"] = [[_encode_op(op) for op in prog] for prog in plan.programs]
    return d


def dumps(plan: Plan) -> str:
    """The plan file's text: one top-level field per line, one line per tree and per rank's
    program (compact JSON inside each line)."""
    def compact(v: Any) -> str:
        return json.dumps(v, separators=(",", ":"), allow_nan=False)

    fields = []
    for key, v in to_dict(plan).items():
        if key in ("trees", "programs") and v:
            inner = ",\n".join("  " + compact(x) for x in v)
            fields.append(f' "{key}": [\n{inner}\n ]')
        else:
            fields.append(f' "{key}": {compact(v)}')
    return "{\n" + ",\n".join(fields) + "\n}\n"


def digest(plan: Plan) -> str:
    """sha256 of the canonical JSON (figures excluded), first 16 hex digits."""
    text = json.dumps(to_dict(plan, figures=False), sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def save(plan: Plan, path: str | os.PathLike) -> None:
    """Write the plan file atomically (ir/files.py): a failure leaves ``path`` untouched."""
    atomic_write_text(path, dumps(plan))


# -- decoding --------------------------------------------------------------------------------
class _Reader:
    """Typed field access that names the offending field in its error."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, msg: str) -> PlanError:
        return PlanError(msg, self.source)

    def get(self, d: dict, key: str, kinds: tuple, where: str = "", optional: bool = False,
            default: Any = None) -> Any:
        if key not in d:
            if optional:
                return default
            raise self.fail(f"plan file has no field {where + key!r}")
        v = d[key]
        if not _is(v, kinds):
            raise self.fail(f"field {where + key!r} must be {_kinds_text(kinds)}, got {json.dumps(v)[:60]}")
        return v


def _is(v: Any, kinds: tuple) -> bool:
    for k in kinds:
        if k is None and v is None:
            return True
        if k is int and type(v) is int:
            return True
        if k is float and type(v) in (int, float):
            return True
        if k not in (None, int, float) and isinstance(v, k) and not (k is int and isinstance(v, bool)):
            return True
    return False


def _kinds_text(kinds: tuple) -> str:
    names = {None: "null", int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             list: "a list", dict: "an object"}
    return " or ".join(names.get(k, str(k)) for k in kinds)


def _ints(rd: _Reader, v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        raise rd.fail(f"field {what!r} must be a list of integers")
    return v


def _decode_op(rd: _Reader, a: Any, r: int, i: int) -> Any:
    where = f"programs[{r}][{i}]"
    if not isinstance(a, list) or not a or not all(type(x) is int for x in a):
        raise rd.fail(f"{where}: an op must be a non-empty list of integers, got {json.dumps(a)[:60]}")
    code = a[0]

    def ref(b: int, off: int, cnt: int) -> ChunkRef:
        if not 0 <= b < len(BUF_CODES):
            raise rd.fail(f"{where}: buffer code {b} is not 0 (in), 1 (out) or 2 (tmp)")
        return ChunkRef(BUF_CODES[b], off, cnt)

    if 0 <= code <= 2:
        if len(a) < 8:
            raise rd.fail(f"{where}: a {OPCODES[code]} needs 8 fields before its deps, got {len(a)}")
        _, peer, tag, b, off, cnt, tree, chunk = a[:8]
        cls = _MSG_TYPES[code]
        return cls(peer, tag, ref(b, off, cnt), tuple(a[8:]), tree, chunk)
    if code in (3, 4, 6):
        if len(a) < 6:
            raise rd.fail(f"{where}: a {OPCODES[code]} needs 6 fields before its deps, got {len(a)}")
        _, sb, so, db, do, cnt = a[:6]
        src, dst, deps = ref(sb, so, cnt), ref(db, do, cnt), tuple(a[6:])
        if code == 4:
            return Reduce(src, dst, deps)
        return Copy(src, dst, deps, roundtrip=True) if code == 6 else Copy(src, dst, deps)
    if code == 5:
        if len(a) < 5:
            raise rd.fail(f"{where}: a scale needs 5 fields before its deps, got {len(a)}")
        _, b, off, cnt, div = a[:5]
        return Scale(ref(b, off, cnt), div, tuple(a[5:]))
    raise rd.fail(f"{where}: unknown opcode {code} (expected 0..6: {', '.join(OPCODES)})")


def _decode(d: Any, rd: _Reader) -> Plan:
    if not isinstance(d, dict):
        raise rd.fail("not an hcc plan file (the top level is not a JSON object)")
    fmt = d.get("format")
    if fmt != FORMAT:
        raise rd.fail(f"not an hcc plan file (format {json.dumps(fmt)}, expected {FORMAT!r})")
    ver = d.get("version")
    if ver != PLAN_VERSION or type(ver) is not int:
        raise rd.fail(f"plan format version {json.dumps(ver)} is not supported (this hcc reads version {PLAN_VERSION})")
    g = rd.get
    ranks = g(d, "ranks", (list,))
    if not all(isinstance(x, str) for x in ranks):
        raise rd.fail("field 'ranks' must be a list of vertex names")
    topo_d = g(d, "topology", (dict,))
    try:
        topology = Topology.from_dict(topo_d)
    except (KeyError, TypeError, ValueError) as e:
        raise rd.fail(f"field 'topology' is malformed ({type(e).__name__}: {e})") from None
    fig_d = g(d, "figures", (dict,), optional=True, default={})
    fig_kw = {}
    for f in dataclasses.fields(Figures):
        if f.name not in fig_d:  # figures added later keep their defaults in older files
            continue
        if f.type in ("str", str):
            fig_kw[f.name] = g(fig_d, f.name, (str,), where="figures.")
        elif str(f.type).startswith("tuple"):
            v = g(fig_d, f.name, (list,), where="figures.")
            if f.name == "cut_links":
                if not all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x) for x in v):
                    raise rd.fail("field 'figures.cut_links' must be a list of [src, dst] vertex names")
                fig_kw[f.name] = tuple((x[0], x[1]) for x in v)
            else:
                if not all(isinstance(x, str) for x in v):
                    raise rd.fail(f"field 'figures.{f.name}' must be a list of vertex names")
                fig_kw[f.name] = tuple(v)
        else:
            want = (int,) if f.type in ("int", int) else (float,)
            v = g(fig_d, f.name, want, where="figures.")
            fig_kw[f.name] = int(v) if want == (int,) else float(v)
    trees = []
    for i, t in enumerate(g(d, "trees", (list,))):
        w = f"trees[{i}]."
        if not isinstance(t, dict):
            raise rd.fail(f"field 'trees[{i}]' must be an object")
        span = _ints(rd, g(t, "span", (list,), w), w + "span")
        if len(span) != 2:
            raise rd.fail(f"field '{w}span' must be [lo, hi]")
        paths = g(t, "paths", (list,), w, optional=True, default=[])
        if not all(isinstance(p, list) and all(isinstance(x, str) for x in p) for p in paths):
            raise rd.fail(f"field '{w}paths' must be a list of vertex-name lists")
        trees.append(Tree(
            index=g(t, "index", (int,), w),
            root=g(t, "root", (int,), w),
            parent=tuple(_ints(rd, g(t, "parent", (list,), w), w + "parent")),
            rate=float(g(t, "rate", (float,), w)),
            span=(span[0], span[1]),
            paths=tuple(tuple(p) for p in paths),
        ))
    progs_d = g(d, "programs", (list,))
    programs = []
    for r, prog in enumerate(progs_d):
        if not isinstance(prog, list):
            raise rd.fail(f"field 'programs[{r}]' must be a list of ops")
        programs.append(tuple(_decode_op(rd, a, r, i) for i, a in enumerate(prog)))
    return Plan(
        name=g(d, "name", (str,)),
        kind=g(d, "kind", (str,)),
        ranks=tuple(ranks),
        root=g(d, "root", (int,)),
        size_bytes=g(d, "size_bytes", (int,)),
        dtype=g(d, "dtype", (str,)),
        op=g(d, "op", (str, None)),
        algorithm=g(d, "algorithm", (str,)),
        chunk_bytes=g(d, "chunk_bytes", (int,)),
        trees=tuple(trees),
        programs=tuple(programs),
        tmp_elems=tuple(_ints(rd, g(d, "tmp_elems", (list,)), "tmp_elems")),
        topology=topology,
        figures=Figures(**fig_kw),
        compress=g(d, "compress", (str,), optional=True, default="none"),
        on_failure=g(d, "on_failure", (str,), optional=True, default="abort"),
        adaptive=g(d, "adaptive", (bool, None), optional=True, default=False),
        peers=g(d, "peers", (str, None), optional=True, default=None),
        version=ver,
    )


def loads(text: str, source: str = "<plan>") -> Plan:
    """Parse a plan file's text and verify the plan; every fault is a :class:`PlanError`
    prefixed with ``source``."""
    rd = _Reader(source)
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        hint = " (the file looks truncated)" if e.pos >= len(text.rstrip()) else ""
        raise rd.fail(f"not a valid plan file: {e.msg} at line {e.lineno} column {e.colno}{hint}") from None
    except RecursionError:
        raise rd.fail("not a valid plan file: nested too deeply") from None
    plan = _decode(d, rd)
    try:
        plan.verify()
    except VerifyError as e:
        raise VerifyError(e.message, source, e.rank, e.op) from None
    return plan


def load(path: str | os.PathLike) -> Plan:
    source = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PlanError(f"cannot read the plan file: {e.strerror or e}", source) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError(f"not a valid plan file: not UTF-8 text (byte {e.start})", source) from None
    return loads(text, source)


# -- summary -----------------------------------------------------------------------------------
def summary(plan: Plan) -> dict:
    """The facts of a plan, as ``hcc compile --json`` prints them (one object per plan)."""
    f = plan.figures
    return {
        "name": plan.name,
        "kind": plan.kind,
        "topology": plan.topology.name,
        "ranks": plan.n,
        "root": plan.ranks[plan.root] if plan.root >= 0 else None,
        "size_bytes": plan.size_bytes,
        "dtype": plan.dtype,
        "op": plan.op,
        "algorithm": plan.algorithm,
        "trees": len(plan.trees),
        "chunk_bytes": plan.chunk_bytes,
        "compress": plan.compress,
        "rate_Bps": f.rate_Bps,
        "bound_rate_Bps": f.bound_rate_Bps,
        "predicted_s": f.predicted_s,
        "bound_s": f.bound_s,
        "efficiency": f.efficiency,
        "ring_predicted_s": f.ring_predicted_s,
        "tree_predicted_s": f.tree_predicted_s,
        "speedup_over_ring": f.ring_predicted_s / f.predicted_s if f.predicted_s > 0 and f.ring_predicted_s > 0 else None,
        "algbw_Bps": f.algbw_Bps,
        "busbw_Bps": f.busbw_Bps,
        "wire_bytes": f.wire_bytes,
        "exact_predicted_s": f.exact_predicted_s or None,
        "speedup_over_exact": f.exact_predicted_s / f.predicted_s if f.exact_predicted_s and f.predicted_s > 0 else None,
        "compile_s": f.compile_s,
        "baseline": f.baseline or None,
        "baseline_predicted_s": f.baseline_predicted_s or None,
        "speedup_over_baseline": f.baseline_predicted_s / f.predicted_s if f.baseline_predicted_s and f.predicted_s > 0 else None,
        "rings_predicted_s": f.rings_predicted_s or None,
        "ring_channels": f.ring_channels,
        "rd_predicted_s": f.rd_predicted_s or None,
        "pack_rate_Bps": f.pack_rate_Bps or None,
        "cut": {"vertices": list(f.cut_vertices), "links": [list(l) for l in f.cut_links],
                "capacity_Bps": f.cut_capacity_Bps, "direction": f.cut_direction, "what": f.cut_note}
        if f.cut_direction else None,
        "breakdown": {"bandwidth_bound_s": f.bandwidth_bound_s, "load_s": f.load_s, "fill_s": f.fill_s,
                      "message_s": f.message_s, "contention_s": f.contention_s,
                      "bottleneck_link": list(f.bottleneck_link)} if f.bottleneck_link else None,
    }
