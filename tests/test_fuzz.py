"""Fuzzing the three doors hostile bytes come through (issue 21, item 3): the HCL grammar and
front end, the plan-file reader, and the sockets transport's frame decoder. The property is the
same at each: bad input ends in exit status 2 or a typed error (SourceError, PlanError, a
RuntimeFault naming the peer), never a traceback, an untyped exception, or a hang.

Examples are bounded (``max_examples``) and derandomized so a CI run is reproducible; no
per-example deadline (the machine is shared, and slowness is not the property), but every test
has a pytest-timeout so a hang fails rather than stalls the suite.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hcc.cli import main
from hcc.compiler.frontend import load_program
from hcc.grammar.diagnostics import SourceError
from hcc.ir.errors import PlanError
from hcc.ir.serialize import dumps, loads

from conftest import SAMPLES

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

SMALL = """\
topology t {
    node g[0..3]
    class fast = 10 GB/s, 1 us
    switch sw
    g[0..3] <-> sw : fast
    g0 <-> g1 : 25 GB/s x2
    host h[0..1] { node c  c <-> sw : 1 GB/s }
}
collective b = broadcast on t { ranks = g[0..3]  root = g1  size = 1 MB }
collective r = allreduce on t { size = 64 KB  op = max  dtype = int32  chunk = 16 KB }
"""
SAMPLE_TEXTS = [SMALL] + [p.read_text() for p in sorted(SAMPLES.glob("*.hcl"))[:4]]

# pieces a user (or an attacker) might put anywhere: the language's own tokens, numbers at and
# past every limit, and the separators and bytes that shift line counts
PIECES = ["topology", "collective", "host", "node", "switch", "class", "{", "}", "[", "]", "..",
          ",", ".", "=", ":", "->", "<->", "#", "\n", "\r", "\r\n", "\f", "\v", "\u2028", "\x00",
          "\t", " ", "g[0..65535]", "h[0..65535]", "1e999999999", "1e400", "1e-400", "-1",
          "0", "x0", "x99999999999", "1" * 120, "9" * 5000, "GB/s", "us", "MB", "KiB",
          "broadcast", "allreduce", "size", "ranks", "root", "op", "é", "\ufeff", "\udcff"]


def _run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


def _mutated(draw_text: str, edits: list[tuple[int, int, str]]) -> str:
    s = draw_text
    for pos, cut, piece in edits:
        i = pos % (len(s) + 1)
        s = s[:i] + piece + s[i + cut:]
    return s


edit = st.tuples(st.integers(0, 10**6), st.integers(0, 8), st.sampled_from(PIECES) | st.text(max_size=6))


# ---- the grammar and the front end --------------------------------------------------------------

def _check_source(src: str) -> None:
    try:
        load_program(src)
    except SourceError as e:
        out = e.render()  # renders, with a position inside the text
        assert e.span.line >= 1 and e.span.col >= 1, out
        assert out.startswith(f"{e.span.path}:")


@pytest.mark.timeout(240)
@FUZZ
@given(st.sampled_from(SAMPLE_TEXTS), st.lists(edit, min_size=1, max_size=6))
def test_mutated_programs_give_a_source_error_or_a_program(base, edits):
    _check_source(_mutated(base, edits))


@pytest.mark.timeout(240)
@FUZZ
@given(st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=40))
def test_token_soup_gives_a_source_error_or_a_program(pieces):
    _check_source(" ".join(pieces))


# Well-formed programs with hostile values: random edits mostly break the syntax, so these
# reach the front end's counting, the number reader and the unit checks every time. Indices
# are small, just past a limit, or absurd (no 1000-vertex cliques: a legal million-arc
# topology is slow to build, not hostile).
_idx = st.sampled_from(["0", "1", "2", "3"] * 8 + ["255", "300", "70000", "999999999", "1" + "0" * 5000])
_vname = st.sampled_from(["g", "n", "sw"])
_part = (st.builds(lambda n, a, b: f"{n}[{a}..{b}]", _vname, _idx, _idx)
         | st.builds(lambda n, a: f"{n}{a}", _vname, st.sampled_from(["0", "1", "2", "3"])))
_ref = _part | _part.map(lambda p: "h[0..1]." + p)
_num = st.sampled_from(["1", "25", "0", "-1", "1.5", ".5", "1e999999999", "1e400", "1e-400",
                        "1e-999999999", "9" * 120, "2e308", "1e25", "1e18", "3601"])
_unit = st.sampled_from(["GB/s", "B/s", "Gbit/s", "us", "s", "MB", "B", "TiB", "", "Gb/s", "xyz"])
_qty = st.builds(lambda n, u: f"{n} {u}".strip(), _num, _unit)
_lref = st.sampled_from(["g0", "g1", "g[0..3]", "n[1..2]", "sw", "h[0..1].g0", "h[0..1].g[0..3]"]) | _ref
_link = st.builds(lambda a, arrow, b, q, lat, mult: f"{a} {arrow} {b} : {q}{mult}{lat}",
                  _lref, st.sampled_from(["->", "<->"]), _lref, _qty,
                  st.sampled_from(["", ", 1 us"]) | _qty.map(lambda q: ", " + q),
                  st.sampled_from([""] * 8 + [" x2", " x0", " x99999999999", " x65537"]))
_decl = st.builds(lambda k, a, b: f"{k} m[{a}..{b}]", st.sampled_from(["node", "switch"]), _idx, _idx)
_host = st.builds(lambda r, body: f"host h{r} {{ {' '.join(body)} }}",
                  st.sampled_from(["[2..3]", "[4..5]", "[6..255]", "[9..70000]", "9", "[0..1]"]),
                  st.lists(_decl | _link, max_size=2))
_coll = st.builds(lambda kind, size, ranks: f"collective c = {kind} on t {{ size = {size} {ranks} }}",
                  st.sampled_from(["broadcast", "allreduce", "alltoall"]), _qty,
                  st.sampled_from(["", "ranks = g[0..3]"]) | _ref.map(lambda r: f"ranks = {r}"))
_program = st.builds(lambda stmts, coll: ("topology t {\n node g[0..3], n[0..3]\n switch sw\n"
                                          " host h[0..1] { node g[0..3] }\n"
                                          + "\n".join(stmts) + "\n}\n" + coll),
                     st.lists(_link | _link | _decl | _host, min_size=1, max_size=4), _coll)


@pytest.mark.timeout(240)
@settings(FUZZ, max_examples=100)
@given(_program)
def test_well_formed_programs_with_hostile_values(src):
    _check_source(src)


@pytest.mark.timeout(240)
@settings(FUZZ, max_examples=60)
@given(st.sampled_from(SAMPLE_TEXTS), st.lists(edit, max_size=4), st.binary(max_size=16),
       st.integers(0, 10**6))
def test_hcc_check_exits_0_or_2_on_any_bytes(tmp_path, base, edits, junk, at):
    data = _mutated(base, edits).encode("utf-8", "surrogatepass")
    i = at % (len(data) + 1)
    p = tmp_path / "fuzz.hcl"
    p.write_bytes(data[:i] + junk + data[i:])
    rc, err = _run_cli(["check", str(p)])
    assert rc in (0, 2), err
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2:
        assert err.startswith(f"{p}:"), err


# ---- the plan file ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan_text() -> str:
    import hcc

    return dumps(hcc.compile(SMALL, "r"))


json_leaf = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
             | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
             | st.sampled_from([-1, 0, -1e-9, 1e308, 2**63, "NaN"]))
json_value = st.recursive(json_leaf, lambda kids: st.lists(kids, max_size=4)
                          | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=12)


def _paths(v, prefix=()):
    """Every position in a JSON value: (path, value)."""
    yield prefix, v
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, prefix + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, prefix + (i,))


def _replace(v, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(v, dict):
        return {**v, head: _replace(v[head], rest, new)}
    return [_replace(x, rest, new) if i == head else x for i, x in enumerate(v)]


def _check_plan(text: str) -> None:
    try:
        loads(text, "fuzz.json")
    except PlanError as e:
        assert str(e).startswith("fuzz.json: error: "), e


@pytest.mark.timeout(240)
@FUZZ
@given(st.data())
def test_mutated_plan_fields_give_a_plan_error_or_a_plan(plan_text, data):
    d = json.loads(plan_text)
    places = [p for p, _ in _paths(d) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(places))
        try:
            d = _replace(d, path, data.draw(json_value))
        except (KeyError, IndexError, TypeError):  # an earlier edit removed this place
            continue
    _check_plan(json.dumps(d))


@pytest.mark.timeout(240)
@FUZZ
@given(st.lists(edit, min_size=1, max_size=5))
def test_mutated_plan_text_gives_a_plan_error_or_a_plan(plan_text, edits):
    _check_plan(_mutated(plan_text, edits))


@pytest.mark.timeout(240)
@settings(FUZZ, max_examples=40)
@given(st.data())
def test_hcc_simulate_exits_0_or_2_on_a_mutated_plan(tmp_path, plan_text, data):
    """The commands that read a plan file: refused at load (2) or run (0), never a loop."""
    d = json.loads(plan_text)
    links = d["topology"]["links"]
    i = data.draw(st.integers(0, len(links) - 1))
    field = data.draw(st.sampled_from([2, 3]))
    links[i][field] = data.draw(st.sampled_from([-1e-6, 0, -1, 1e-300, 5e-7, 1e9, 1e30]) | json_leaf)
    p = tmp_path / "fuzz.json"
    p.write_text(json.dumps(d))
    rc, err = _run_cli(["simulate", str(p)])
    assert rc in (0, 2), err
    assert "Traceback" not in err and "internal error" not in err, err


# ---- the sockets frame decoder ----------------------------------------------------------------

TOKEN = b"fuzz-token"


@contextlib.contextmanager
def _rank1():
    """Rank 1 of a 2-rank job, listening; the test dials it as rank 0 over the real handshake."""
    from hcc.backends.sockets import SocketTransport

    listener = socket.create_server(("127.0.0.1", 0))
    t = SocketTransport(1, 2, TOKEN, {0: ("127.0.0.1", 1)}, listener, timeout=10.0,
                        max_message=1 << 16)
    try:
        yield t, listener.getsockname()[:2]
    finally:
        t.close()


def _reader_of(t):
    """Rank 0's connection on ``t`` once its reader thread runs (the accept side attaches it
    just after the handshake's last byte, so the dialer may get there first)."""
    import time

    end = time.monotonic() + 10.0
    while time.monotonic() < end:
        conn = t._conns.get(0)
        if conn is not None and conn.reader is not None and conn.reader.ident is not None:
            return conn
        time.sleep(0.01)
    raise AssertionError("rank 1 never attached the connection")


frame = st.fixed_dictionaries({
    "magic": st.sampled_from([b"HCCF"] * 6 + [b"HCCX", b"\0\0\0\0"]),
    "kind": st.sampled_from([0, 0, 0, 1, 2, 3, 255]),
    "session": st.sampled_from(["good"] * 6 + ["bad"]),
    "plan": st.sampled_from([0, 1, 2**32 - 1]),
    "tag": st.sampled_from([0, 1, 2, 7, 2**31, 2**32 - 1]),
    "length": st.sampled_from([0, 1, 8, 4096, 1 << 16, (1 << 16) + 1, 2**31, 2**63, 2**64 - 1]),
    "body": st.binary(max_size=64),
})


@pytest.mark.timeout(240)
@settings(FUZZ, max_examples=60)
@given(st.lists(frame, min_size=1, max_size=5), st.binary(max_size=40), st.booleans())
def test_frame_decoder_ends_in_a_typed_fault(monkeypatch, frames, tail, post_first):
    """Authenticated (the dangerous case: a peer that knows the token) but arbitrary frames:
    the reader thread ends with a ProtocolError or the peer marked dead, a posted receive gets
    that typed fault or its data, and no exception escapes any thread."""
    from hcc.backends.base import CollectiveTimeout, RuntimeFault
    from hcc.backends.sockets import FRAME, dial_handshake

    escaped = []
    monkeypatch.setattr(threading, "excepthook", lambda a: escaped.append(a.exc_value))
    with _rank1() as (t, addr):
        sock, session = dial_handshake(addr, TOKEN, 0, 1, 2, 10.0)
        buf = bytearray(8)
        req = t.irecv(0, 7, memoryview(buf)) if post_first else None
        try:
            for f in frames:
                sess = session if f["session"] == "good" else os.urandom(8)
                length = f["length"]
                sock.sendall(FRAME.pack(f["magic"], f["kind"], sess, f["plan"], f["tag"], length)
                             + f["body"][: min(length, 64)])
            sock.sendall(tail)
        except OSError:
            pass  # the transport already closed on a bad frame
        sock.close()
        if req is not None:
            try:
                t.wait_any([req], 10.0)
            except CollectiveTimeout:  # the only wrong answer: the fault was not noticed
                raise AssertionError("a posted receive waited out its deadline after a bad frame")
            except RuntimeFault:
                pass
        conn = _reader_of(t)
        conn.reader.join(10.0)
        assert not conn.reader.is_alive(), "the reader thread is stuck"
        assert 0 in t._dead or 0 in t._errors or conn.bye_received
    assert not escaped, escaped


def test_a_fail_frame_must_name_a_rank_of_the_world():
    """A FAIL frame's tag names a dead rank; one outside the world (2^31) was recorded as if a
    rank of that number had died."""
    from hcc.backends.sockets import FAIL, FRAME, dial_handshake

    with _rank1() as (t, addr):
        sock, session = dial_handshake(addr, TOKEN, 0, 1, 2, 10.0)
        sock.sendall(FRAME.pack(b"HCCF", FAIL, session, 0, 2**31, 0))
        conn = _reader_of(t)
        conn.reader.join(10.0)
        assert "outside a world of 2" in str(t._errors.get(0)), t._errors
        assert 2**31 not in t._dead
        sock.close()


def test_the_transport_handshake_has_one_deadline_as_a_whole(monkeypatch):
    """A dialer trickling its HELLO a byte at a time is cut off at the handshake's deadline,
    not allowed ``timeout`` per byte."""
    import time

    from hcc.backends import sockets

    with _rank1() as (t, addr):
        t.timeout = 0.5  # the accept side bounds its handshake by min(timeout, 10 s)
        s = socket.create_connection(addr, timeout=5)
        start, closed = time.monotonic(), False
        for _ in range(sockets.HELLO.size + 10):
            try:
                s.sendall(b"H")
                s.settimeout(0.2)
                if s.recv(1) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
        took = time.monotonic() - start
        s.close()
    assert closed and took < 5.0, took


def test_the_transport_caps_unauthenticated_connections(monkeypatch):
    from hcc.backends import rendezvous, sockets

    def eof(s) -> bool:
        s.settimeout(5)
        try:
            return s.recv(1) == b""
        except ConnectionResetError:
            return True

    monkeypatch.setattr(sockets, "MAX_PENDING", 3)
    monkeypatch.setattr(rendezvous, "PENDING_GRACE_S", 0.0)  # the oldest may always go
    with _rank1() as (t, addr):
        idle = [socket.create_connection(addr, timeout=5) for _ in range(8)]
        for s in idle:
            s.sendall(b"H")  # each is in the handshake, waiting for the rest of its HELLO
        assert sum(eof(s) for s in idle[:5]) == 5  # the five oldest were dropped
        assert len(t._pending) <= 3
        for s in idle:
            s.close()
    monkeypatch.setattr(rendezvous, "PENDING_GRACE_S", 3600.0)  # none old enough: newcomers go
    with _rank1() as (t, addr):
        idle = [socket.create_connection(addr, timeout=5) for _ in range(3)]
        import time

        end = time.monotonic() + 10
        while len(t._pending) < 3 and time.monotonic() < end:
            time.sleep(0.01)
        late = socket.create_connection(addr, timeout=5)
        assert eof(late) and len(t._pending) == 3
        for s in idle + [late]:
            s.close()


def test_pack_is_what_the_decoder_reads():
    """The fuzzer's frames are the decoder's format (a guard against fuzzing the wrong bytes)."""
    from hcc.backends.sockets import FRAME

    assert FRAME.size == 32 and struct.calcsize("!4sB3x8sIIQ") == 32
