"""hcc.ir.viz_trace — timelines of a plan as Chrome / Perfetto trace-event JSON.

Terms:

- **lane**: one track of the trace that never holds two overlapping slices. Transfers that
  overlap on one link (cut-through hops, a queue of messages) go to the link's next lane.
- **hop chain**: the simulator's events of one message, one per link of its path, in order.

Functions:

- :func:`to_trace`: a trace from a simulation the caller ran (the compiler's
  ``simulate(plan, detail=True)``; this module takes its result and never imports the
  compiler — the stages import one way). Process 1 holds one lane per concurrent transfer on
  each link; then one process per rank with its send and receive lanes; flow events (``ph``
  ``s``/``f``) follow each chunk from hop to hop and from the rank that received it to the
  rank it forwards it to. Timestamps are microseconds, as the trace-event format defines.
- :func:`measured_trace`: the same axes for a measured run (``hcc run --trace``), with the
  prediction beside it.
"""
from __future__ import annotations

from .errors import ArgumentValueError
from .plan import Plan

__all__ = ["to_trace", "measured_slices", "measured_trace", "MEASURED_PID", "PREDICTED_PID"]


# ---------------------------------------------------------------- trace
def _lanes(items: list[tuple[float, float, int]]) -> dict[int, int]:
    """Greedy interval partitioning: ``(start, end, id)`` -> lane, no two overlapping slices in
    one lane; a slice reuses the lowest lane free at its start."""
    free_at: list[float] = []
    out: dict[int, int] = {}
    for start, end, i in sorted(items):
        for lane, t in enumerate(free_at):
            if t <= start:
                free_at[lane] = end
                out[i] = lane
                break
        else:
            out[i] = len(free_at)
            free_at.append(end)
    return out


def _rank_lanes(out: list[dict], pid: int, per_what: dict[str, list[tuple[float, float, int]]]) -> dict[int, int]:
    """Name the send, receive and local-work lanes of one rank's process ``pid`` (appended to
    ``out``) and give each item ``(start, end, id)`` its track: ``id -> tid``; the sends'
    lanes first."""
    tids: dict[int, int] = {}
    t0 = 0
    for what in ("send", "recv", "local"):
        items = per_what.get(what, [])
        if not items:
            continue
        lanes = _lanes(items)
        for lane in range(max(lanes.values()) + 1):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": t0 + lane + 1,
                        "args": {"name": what + (f" #{lane + 1}" if lane else "")}})
        for _, _, i in items:
            tids[i] = t0 + lanes[i] + 1
        t0 += max(lanes.values()) + 1
    return tids


def _hop_chains(plan: Plan, events) -> list[list[int]]:
    """The events of each message, hop after hop: the simulator records one event per link of
    a message's path; chain the events of one (src, dst, tree, chunk) whose links continue
    each other, in start order."""
    groups: dict[tuple, list[int]] = {}
    for i, ev in enumerate(events):
        groups.setdefault((ev.src, ev.dst, ev.tree, ev.chunk), []).append(i)
    chains: list[list[int]] = []
    for (src, _, _, _), idx in groups.items():
        idx.sort(key=lambda i: (events[i].start, events[i].end))
        open_: list[list[int]] = []
        for i in idx:
            ev = events[i]
            home = next((c for c in open_ if events[c[-1]].link[1] == ev.link[0]
                         and events[c[-1]].link[1] != plan.ranks[ev.dst]), None)
            if home is None or ev.link[0] == plan.ranks[src]:
                home = []
                open_.append(home)
                chains.append(home)
            home.append(i)
    return chains


def to_trace(plan: Plan, simulation) -> dict:
    """Chrome/Perfetto trace-event JSON (as a dict) of a simulation with ``detail=True``:
    ``simulation`` has ``events`` (each with ``src, dst, link, tree, chunk, bytes, start,
    end``), ``time`` and ``messages`` — the compiler's ``Simulation``."""
    evs = list(simulation.events)
    if not evs and simulation.messages:
        raise ArgumentValueError("to_trace needs a simulation run with detail=True (it has no events)")
    out: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                        "args": {"name": f"links: {plan.name} ({plan.kind}, {plan.algorithm}), predicted"}},
                       {"name": "process_sort_index", "ph": "M", "pid": 1, "tid": 0, "args": {"sort_index": 0}}]
    order = sorted(range(len(evs)), key=lambda i: (evs[i].start, evs[i].end, evs[i].link))

    def label(ev) -> str:
        return f"T{ev.tree} c{ev.chunk}" if ev.tree >= 0 else f"r{ev.src}->r{ev.dst} c{ev.chunk}"

    def slice_(ev, pid, tid, seq) -> dict:
        return {"name": label(ev), "cat": f"tree{ev.tree}", "ph": "X", "pid": pid, "tid": tid,
                "ts": ev.start * 1e6, "dur": max(ev.end - ev.start, 0.0) * 1e6,
                "args": {"src_rank": ev.src, "dst_rank": ev.dst, "link": f"{ev.link[0]} -> {ev.link[1]}",
                         "bytes": ev.bytes, "tree": ev.tree, "chunk": ev.chunk, "seq": seq}}

    # links: one lane per concurrent transfer
    by_link: dict[tuple[str, str], list[int]] = {}
    for i in order:
        by_link.setdefault(tuple(evs[i].link), []).append(i)
    where: dict[int, tuple[int, int]] = {}  # event -> (pid, tid) of its link slice
    tid = 0
    for l in sorted(by_link):
        lanes = _lanes([(evs[i].start, evs[i].end, i) for i in by_link[l]])
        base = tid + 1
        for lane in range(max(lanes.values()) + 1):
            name = f"{l[0]} -> {l[1]}" + (f" #{lane + 1}" if lane else "")
            out.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": base + lane, "args": {"name": name}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": base + lane,
                        "args": {"sort_index": base + lane}})
        tid = base + max(lanes.values())
        for seq, i in enumerate(by_link[l]):
            where[i] = (1, base + lanes[i])
            out.append(slice_(evs[i], 1, base + lanes[i], seq))
    # ranks: a process each; a send lane set (first hop of a message) and a receive lane set
    chains = _hop_chains(plan, evs)
    per_rank: dict[tuple[int, str], list[tuple[float, float, int]]] = {}
    msg_of: dict[int, tuple[float, float, int]] = {}
    for c, chain in enumerate(chains):
        first, last = evs[chain[0]], evs[chain[-1]]
        msg_of[c] = (first.start, max(evs[i].end for i in chain), c)
        per_rank.setdefault((first.src, "send"), []).append(msg_of[c])
        per_rank.setdefault((first.dst, "recv"), []).append(msg_of[c])
    for r in sorted({r for r, _ in per_rank}):
        pid = 2 + r
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"name": f"rank {r} ({plan.ranks[r] if r < len(plan.ranks) else '?'})"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        # a chain is one rank's send and another's receive: its id is unique within a rank
        tids = _rank_lanes(out, pid, {what: per_rank.get((r, what), []) for what in ("send", "recv")})
        for what in ("send", "recv"):
            for start, end, c in sorted(per_rank.get((r, what), [])):
                ev = evs[chains[c][0]]
                s = slice_(ev, pid, tids[c], c)
                s["name"] = ("send " if what == "send" else "recv ") + label(ev)
                s["ts"], s["dur"] = start * 1e6, max(end - start, 0.0) * 1e6
                s["args"].pop("link")
                out.append(s)
    # flows: hop to hop within a message, and from a chunk's arrival at a rank to the
    # messages that rank sends on with the same tree and chunk
    flow = 0

    def arrow(a: int, b: int) -> None:
        nonlocal flow
        flow += 1
        (pa, ta), (pb, tb) = where[a], where[b]
        out.append({"name": "chunk", "cat": "flow", "ph": "s", "id": flow, "pid": pa, "tid": ta,
                    "ts": evs[a].start * 1e6})
        out.append({"name": "chunk", "cat": "flow", "ph": "f", "bp": "e", "id": flow, "pid": pb, "tid": tb,
                    "ts": evs[b].start * 1e6})

    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            arrow(a, b)
    arrivals: dict[tuple[int, int, int], list[int]] = {}  # (rank, tree, chunk) -> last hops into it
    for chain in chains:
        ev = evs[chain[-1]]
        if ev.tree >= 0:
            arrivals.setdefault((ev.dst, ev.tree, ev.chunk), []).append(chain[-1])
    for chain in chains:
        ev = evs[chain[0]]
        came = [i for i in arrivals.get((ev.src, ev.tree, ev.chunk), ()) if evs[i].end <= ev.start + 1e-12]
        if came:
            arrow(max(came, key=lambda i: evs[i].end), chain[0])
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"plan": plan.name, "predicted_s": simulation.time, "messages": simulation.messages}}


# ---------------------------------------------------------------- measured trace
# pids of a measured trace: rank r measured at MEASURED_PID + r, its prediction beside it
MEASURED_PID = 2
PREDICTED_PID = 100000


def _op_index(program) -> dict[tuple[str, int, int], int]:
    """``(kind, peer, tag) -> op`` of one rank's program (a plan has one transfer op per key)."""
    from .plan import Send

    out: dict[tuple[str, int, int], int] = {}
    for k, op in enumerate(program):
        if hasattr(op, "peer"):
            out["send" if isinstance(op, Send) else "recv", op.peer, op.tag] = k
    return out


_LOCAL = {"Copy": "copy", "Reduce": "reduce", "RecvReduce": "reduce", "Scale": "scale"}


def _local_row(program, r: int, k, t0: float, t1: float) -> dict:
    """The row of a local event: op ``k`` of rank ``r``'s program ran from ``t0`` to ``t1``."""
    op = program[k] if isinstance(k, int) and 0 <= k < len(program) else None
    kind = _LOCAL.get(type(op).__name__)
    if kind is None:
        raise ArgumentValueError(f"rank {r}: measured local work of op {k!r}, which is no local op of the plan")
    return {"rank": r, "op": k, "kind": kind, "peer": -1, "tag": -1, "tree": getattr(op, "tree", -1),
            "chunk": getattr(op, "chunk", -1), "elems": op.dst.count, "start": float(t0), "end": float(t1)}


def measured_slices(plan: Plan, records: list[dict], step: int = 0) -> list[dict]:
    """The transfers of one measured run, one dict per op of every rank's program:
    ``rank, op, kind, peer, tag, tree, chunk, bytes, start, end`` (seconds on the ranks'
    shared monotonic clock). ``records[r]`` is rank r's ``{"events": [(kind, peer, tag,
    posted, done), ...]}`` (backends/tracing.py). A send runs from its post to its completion;
    a receive from the later of its post and its matching send's post (the bytes cannot move
    earlier; every receive is posted when its dependencies are met, often long before) to its
    completion. A local event (``("local", op, 0, start, end)``) is a row of kind ``copy``,
    ``reduce`` (a Reduce, or a RecvReduce's staged reduction) or ``scale`` for that op, peer
    and tag -1. Raises :class:`ArgumentValueError` when an event matches no op."""
    programs = plan.programs_at(step)
    posted: dict[tuple[int, int, int], float] = {}  # (src, dst, tag) -> the send's post
    rows: list[dict] = []
    for r, rec in enumerate(records):
        index = _op_index(programs[r])
        for kind, peer, tag, t0, t1 in rec["events"]:
            if kind == "local":
                rows.append(_local_row(programs[r], r, peer, t0, t1))
                continue
            k = index.get((kind, int(peer), int(tag)))
            if k is None:
                raise ArgumentValueError(f"rank {r}: measured {kind} with rank {peer} tag {tag} is no op of the plan")
            op = programs[r][k]
            ref = op.src if kind == "send" else op.dst
            rows.append({"rank": r, "op": k, "kind": kind, "peer": int(peer), "tag": int(tag), "tree": op.tree,
                         "chunk": op.chunk, "elems": ref.count, "start": float(t0), "end": float(t1)})
            if kind == "send":
                posted[r, int(peer), int(tag)] = float(t0)
    for row in rows:
        if row["kind"] == "recv":
            sent = posted.get((row["peer"], row["rank"], row["tag"]))
            if sent is not None:
                row["start"] = min(max(row["start"], sent), row["end"])
    return rows


def measured_trace(runs: list[tuple[Plan, list[dict], object | None]], origin: float | None = None) -> dict:
    """Chrome/Perfetto trace-event JSON of measured runs (``hcc run --trace``), on the axes of
    :func:`to_trace`: one process per rank (pid ``2 + r``, as the prediction's), with send,
    receive and local lanes (copies, reductions; no two slices of a lane overlap), slices named as the prediction names them
    (``send T0 c3``), flows from each send to its matching receive and from a chunk's arrival
    at a rank to the sends that forward it. ``runs``: ``(plan, records, simulation)`` per
    collective, ``records`` as :func:`measured_slices` takes them plus ``start`` (the run's
    start on the same clock); ``simulation`` (``detail=True``) or None. Each prediction is
    drawn beside the measured ranks (pid ``100000 + 2 + r``, links at ``100001``), shifted
    to start when its measured run started. Time 0 is ``origin`` (default: the first run's
    start); microseconds, as the format defines."""
    out: list[dict] = []
    if not runs:
        return {"traceEvents": out, "displayTimeUnit": "ns"}
    if origin is None:
        origin = min(min(rec["start"] for rec in records) for _, records, _ in runs)
    per_lane: dict[tuple[int, str], list[tuple[float, float, int]]] = {}
    slices: list[dict] = []
    names: dict[int, str] = {}
    summary = []
    for c, (plan, records, sim) in enumerate(runs):
        rows = measured_slices(plan, records)
        start = min(rec["start"] for rec in records)
        end = max(rec.get("end", start) for rec in records)
        summary.append({"plan": plan.name, "measured_s": end - start,
                        "predicted_s": getattr(sim, "time", None),
                        "ops": sum(row["kind"] in ("send", "recv") for row in rows)})
        for r in range(plan.n):
            names.setdefault(r, f"rank {r} ({plan.ranks[r]})")
        for row in rows:
            row["collective"] = c
            local = row["kind"] not in ("send", "recv")
            row["name"] = f"{row['kind']} " + (f"T{row['tree']} c{row['chunk']}" if row["tree"] >= 0 else
                                               f"op {row['op']}" if local else
                                               (f"r{row['rank']}->r{row['peer']} c{row['chunk']}" if row["kind"] == "send"
                                                else f"r{row['peer']}->r{row['rank']} c{row['chunk']}"))
            row["bytes"] = row.pop("elems") * plan.itemsize
            i = len(slices)
            slices.append(row)
            per_lane.setdefault((row["rank"], "local" if local else row["kind"]), []).append((row["start"], row["end"], i))
        if sim is not None:
            shift = (start - origin) * 1e6
            pred = to_trace(plan, sim)["traceEvents"]
            for ev in pred:
                ev = dict(ev)
                own = ev["pid"]  # 1: the links; 2 + r: rank r
                ev["pid"] = PREDICTED_PID + own
                if ev.get("name") == "process_name" and own >= 2:
                    ev["args"] = {"name": ev["args"]["name"] + " predicted"}
                if ev.get("name") == "process_sort_index":
                    ev["args"] = {"sort_index": 2 * (own - 2) + 3 if own >= 2 else 1_000_000}
                if "ts" in ev:
                    ev["ts"] = ev["ts"] + shift
                if ev.get("ph") in ("s", "f"):
                    ev["id"] = f"p{c}-{ev['id']}"
                if ev.get("name") == "process_name" and own == 1 and len(runs) > 1:
                    ev["args"] = {"name": "links, predicted"}
                out.append(ev)
    where: dict[int, tuple[int, int]] = {}
    for r in sorted(names):
        pid = MEASURED_PID + r
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": names[r] + " measured"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": 2 * r + 2}})
        tids = _rank_lanes(out, pid, {what: per_lane.get((r, what), []) for what in ("send", "recv", "local")})
        where.update((i, (pid, tid)) for i, tid in tids.items())
    for i, row in enumerate(sorted(range(len(slices)), key=lambda i: (slices[i]["start"], slices[i]["end"]))):
        s = slices[row]
        pid, tid = where[row]
        out.append({"name": s["name"], "cat": f"tree{s['tree']}", "ph": "X", "pid": pid, "tid": tid,
                    "ts": (s["start"] - origin) * 1e6, "dur": max(s["end"] - s["start"], 0.0) * 1e6,
                    "args": {k: s[k] for k in ("collective", "rank", "peer", "op", "tag", "tree", "chunk", "bytes")}
                    | {"seq": i}})
    # flows: each send to its receive; each receive to the sends of the same (tree, chunk)
    # that its rank posted after it completed (the forwarding)
    flow = 0

    def arrow(a: int, b: int) -> None:
        nonlocal flow
        flow += 1
        for ph, i in (("s", a), ("f", b)):
            ev = {"name": "chunk", "cat": "flow", "ph": ph, "id": flow, "pid": where[i][0], "tid": where[i][1],
                  "ts": (slices[i]["start"] - origin) * 1e6}
            if ph == "f":
                ev["bp"] = "e"
            out.append(ev)

    recv_of = {(s["collective"], s["peer"], s["rank"], s["tag"]): i for i, s in enumerate(slices) if s["kind"] == "recv"}
    arrived: dict[tuple[int, int, int, int], list[int]] = {}
    for i, s in enumerate(slices):
        if s["kind"] == "recv" and s["tree"] >= 0:
            arrived.setdefault((s["collective"], s["rank"], s["tree"], s["chunk"]), []).append(i)
    for i, s in enumerate(slices):
        if s["kind"] != "send":
            continue
        j = recv_of.get((s["collective"], s["rank"], s["peer"], s["tag"]))
        if j is not None:
            arrow(i, j)
        came = [k for k in arrived.get((s["collective"], s["rank"], s["tree"], s["chunk"]), ())
                if slices[k]["end"] <= s["start"]]
        if came:
            arrow(max(came, key=lambda k: slices[k]["end"]), i)
    return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": {"measured": summary}}

