"""Every fault of language.md "Errors" (and the front end's brief) gets a SourceError at the
exact line and column of the faulty token, with the caret rendered under that column.

Expected positions are found in the test source itself (``at(src, needle)``: the line and
column where ``needle`` occurs), never read back from the implementation."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcc.compiler.frontend import load_program
from hcc.grammar.diagnostics import SourceError


def at(src: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """1-based (line, column) of the ``nth`` occurrence of ``needle`` in ``src``."""
    i = -1
    for _ in range(nth + 1):
        i = src.index(needle, i + 1)
    line = src.count("\n", 0, i) + 1
    col = i - (src.rfind("\n", 0, i) + 1) + 1
    return line, col


def check_error(src: str, line: int, col: int, fragment: str) -> SourceError:
    """Loading ``src`` fails at (line, col) with ``fragment`` in the message, and render()
    shows ``<string>:line:col: error:``, the source line and a caret under column ``col``."""
    with pytest.raises(SourceError) as info:
        load_program(src)
    e = info.value
    assert (e.span.line, e.span.col) == (line, col), e.render()
    assert fragment in e.message, e.render()
    out = e.render().splitlines()
    assert out[0] == f"<string>:{line}:{col}: error: {e.message}"
    assert out[1] == "    " + src.splitlines()[line - 1]
    assert out[2].index("^") == 4 + col - 1, e.render()
    return e


def check_at(src: str, needle: str, fragment: str, nth: int = 0, skip: int = 0) -> SourceError:
    """check_error at ``needle`` (its ``nth`` occurrence), ``skip`` columns further right."""
    line, col = at(src, needle, nth)
    return check_error(src, line, col + skip, fragment)


TOPO = """\
topology t {
    node gpu[0..3]
    switch sw
    class fast = 10 GB/s, 1 us
    gpu[0..3] <-> sw : fast
}
"""


def coll(body: str, kind: str = "allreduce", topo: str = "t", name: str = "c") -> str:
    return TOPO + f"collective {name} = {kind} on {topo} {{\n{body}\n}}\n"


# ranks g[0..3] joined both ways, g4 and g5 too, and g3 -> g4 one way only
DISCONNECTED = """\
topology d {
    node g[0..5]
    class nv = 25 GB/s
    g0 <-> g1 : nv
    g1 <-> g2 : nv
    g2 <-> g3 : nv
    g4 <-> g5 : nv
    g3 -> g4 : nv
}
"""


# ---- the helper itself -------------------------------------------------------------------

def test_at_counts_from_one():
    assert at("ab\ncd", "d") == (2, 2)
    assert at("ab\ncd", "a") == (1, 1)


def test_check_error_rejects_a_wrong_column():
    src = TOPO.replace("gpu[0..3] <-> sw", "gpu[0..3] <-> sx")
    with pytest.raises(AssertionError):
        check_error(src, at(src, "sx")[0], at(src, "sx")[1] + 1, "unknown vertex")


# ---- syntax ------------------------------------------------------------------------------

def test_syntax_missing_colon():
    src = "topology t {\n    node a, b\n    a <-> b 10 GB/s\n}\n"
    e = check_at(src, "10 GB/s", "unexpected number '10 GB/s'; expected '.', ':' or '['")
    assert "QUANTITY" not in e.message


def E(id: str, src: str, needle: str, fragment: str, nth: int = 0, skip: int = 0,
      also: tuple = ()):
    """One row of CASES: ``src`` fails at ``needle`` (check_at) with ``fragment`` in the message,
    which also holds every string of ``also``."""
    return pytest.param(src, needle, fragment, nth, skip, also, id=id)


# Faults whose whole check is "this error, at this token": one row each.
CASES = [
    # syntax
    E("syntax_unexpected_character", "topology t {\n    node a, b\n    a <- b : 1 GB/s\n}\n", "<-", "unexpected character '<'", also=("'<->'", "'->'")),
    E("syntax_bad_collective_header", TOPO + "collective c = allreduce t { size = 1 MB }\n", "t {", "expected 'on'", nth=1),
    # names
    E("unknown_vertex_in_link_with_did_you_mean", TOPO.replace("    gpu[0..3] <-> sw : fast", "    gpu0 <-> gpo1 : fast"), "gpo1", "unknown vertex 'gpo1'", also=("did you mean gpu1?",)),
    # the caret is on the range item
    E("unknown_vertex_from_a_range", TOPO.replace("gpu[0..3] <-> sw", "gpu[0..4] <-> sw"), "0..4", "unknown vertex 'gpu4'", also=("gpu[0..4]",)),
    E("unknown_vertex_in_ranks", coll("    ranks = gpu0, gpu1, gpu7\n    size = 1 MB"), "gpu7", "unknown vertex 'gpu7'"),
    E("unknown_vertex_as_root", coll("    root = gpx0\n    size = 1 MB", kind="broadcast"), "gpx0", "did you mean gpu0?"),
    E("unknown_qualified_vertex", """topology c {
    host h[0..1] {
        node gpu[0..1]
        switch nvs
        gpu[0..1] <-> nvs : 10 GB/s
    }
    switch tor
    h[0..2].nvs <-> tor : 1 GB/s
}
""", "0..2", "unknown vertex 'h2.nvs' (from h[0..2].nvs)"),
    E("duplicate_vertex", TOPO.replace("switch sw", "switch sw, gpu2"), "gpu2", "duplicate vertex name 'gpu2'", also=("line 2, column 10",)),
    E("duplicate_vertex_in_a_range", TOPO.replace("node gpu[0..3]", "node gpu[0..3], gpu[3..5]"), "3..5", "duplicate vertex name 'gpu3'"),
    E("duplicate_class", TOPO.replace("    gpu[0..3] <-> sw", "    class fast = 5 GB/s\n    gpu[0..3] <-> sw"), "fast", "duplicate link class name 'fast'", nth=1),
    E("duplicate_key", coll("    size = 1 MB\n    dtype = float32\n    size = 2 MB"), "size", "duplicate key 'size'", nth=1),
    E("duplicate_host", "topology c {\n    host h[0..1] { node g }\n    host h1 { node g }\n}\n", "h1", "duplicate host name 'h1'"),
    E("unknown_topology_did_you_mean", TOPO.replace("topology t", "topology dgx1") + "collective c = broadcast on dgx {\n size = 1 MB\n}\n", "dgx {", "did you mean dgx1?"),
    E("unknown_collective_kind", coll("    size = 1 MB", kind="allreduc"), "allreduc", "did you mean allreduce?"),
    E("unknown_link_class", TOPO.replace("gpu[0..3] <-> sw : fast", "gpu[0..3] <-> sw : fst"), "fst", "unknown link class 'fst' (did you mean fast?)"),
    E("unknown_key", coll("    sise = 1 MB"), "sise", "unknown key 'sise' (did you mean size?)"),
    E("unknown_peers_value", coll("    size = 1 MB\n    peers = rng", kind="neighbor_average"), "rng", "did you mean ring?"),
    E("enumerated_value_that_is_a_number", coll("    size = 1 MB\n    dtype = 4"), "4\n", "expected a dtype"),
    # links
    E("link_to_itself", TOPO.replace("gpu[0..3] <-> sw : fast", "gpu1 -> gpu1 : fast"), "gpu1 :", "to itself"),
    E("zero_bandwidth_literal", TOPO.replace("gpu[0..3] <-> sw : fast", "gpu[0..3] <-> sw : 0 GB/s"), ": 0 GB/s", "a link bandwidth must be positive, got 0 GB/s", skip=2),
    E("negative_bandwidth_in_class", TOPO.replace("class fast = 10 GB/s", "class fast = -10 GB/s"), "-10", "must be positive"),
    E("negative_latency", TOPO.replace("gpu[0..3] <-> sw : fast", "gpu[0..3] <-> sw : fast, -1 us"), "-1 us", "latency cannot be negative"),
    E("negative_latency_in_class", TOPO.replace("10 GB/s, 1 us", "10 GB/s, -3 ns"), "-3", "latency cannot be negative"),
    E("zero_multiplicity", TOPO.replace(": fast\n", ": fast x0\n"), "x0", "at least 1"),
    # units
    E("wrong_unit_family_for_bandwidth", TOPO.replace("class fast = 10 GB/s", "class fast = 10 GB"), "GB,", "expected a bandwidth like 25 GB/s", also=("'GB' is a size unit",)),
    E("wrong_unit_family_for_size", coll("    size = 25 GB/s"), "GB/s", "expected a size like 256 MB", nth=1),
    E("wrong_unit_family_for_latency", TOPO.replace("10 GB/s, 1 us", "10 GB/s, 1 MB"), "MB", "expected a time like 5 us"),
    E("missing_unit_names_the_family", coll("    size = 100"), "100", "a size needs a unit"),
    E("missing_bandwidth_unit", TOPO.replace("gpu[0..3] <-> sw : fast", "gpu[0..3] <-> sw : 25"), "25", "a bandwidth needs a unit"),
    E("missing_latency_unit", TOPO.replace("10 GB/s, 1 us", "10 GB/s, 1"), "1\n", "a time needs a unit"),
    E("unknown_unit_suggests_bits", TOPO.replace("class fast = 10 GB/s", "class fast = 10 Gb/s"), "Gb/s", "unknown unit 'Gb/s'; expected a bandwidth like 25 GB/s (did you mean Gbit/s?)"),
    E("unknown_unit_case", coll("    size = 4 mb"), "mb", "did you mean MB?"),
    # ranks and root
    E("root_outside_ranks", coll("    ranks = gpu[0..2]\n    root = gpu3\n    size = 1 MB", kind="broadcast"), "gpu3", "root 'gpu3' is not one of the ranks"),
    E("switch_as_rank", coll("    ranks = gpu0, sw, gpu1\n    size = 1 MB"), "sw,", "'sw' is a switch and cannot be a rank"),
    E("switch_as_root", coll("    root = sw\n    size = 1 MB", kind="reduce"), "= sw", "cannot be the root", skip=2),
    E("root_on_an_unrooted_kind", coll("    root = gpu0\n    size = 1 MB", kind="allgather"), "root", "'root' applies only to rooted kinds"),
    E("root_is_a_range", coll("    root = gpu[0..1]\n    size = 1 MB", kind="broadcast"), "gpu[0..1]", "the root is one vertex"),
    E("fewer_than_two_ranks_explicit", coll("    ranks = gpu2\n    size = 1 MB", kind="broadcast"), "gpu2", "a broadcast needs at least 2 ranks; got 1 (gpu2)"),
    E("fewer_than_two_ranks_by_default", "topology one {\n    node a\n    switch s\n    a <-> s : 1 GB/s\n}\n"
      "collective g = allgather on one {\n    size = 1 MB\n}\n", "g =", "an allgather needs at least 2 ranks", also=("topology one has 1 node",)),
    E("bad_range", TOPO.replace("node gpu[0..3]", "node gpu[3..0]"), "3..0", "bad range 3..0"),
    E("bad_range_in_ranks", coll("    ranks = gpu[0, 2..1]\n    size = 1 MB"), "2..1", "bad range 2..1"),
    E("qualified_name_declared_outside_its_host", "topology c {\n    node h0.gpu0\n}\n", "h0.gpu0", "declare it inside its host block"),
    # kind-specific keys
    E("op_on_non_reducing_kind", coll("    size = 1 MB\n    op = max", kind="allgather"), "op =", "'op' applies only to reducing kinds"),
    E("op_on_neighbor_average", coll("    size = 1 MB\n    op = sum", kind="neighbor_average"), "op =", "always takes the mean"),
    E("peers_on_other_kind", coll("    size = 1 MB\n    peers = ring"), "peers", "'peers' applies only to neighbor_average"),
    E("op_avg_on_integers", coll("    size = 1 MB\n    dtype = int32\n    op = avg"), "avg", "op = avg needs a floating-point dtype; dtype is int32"),
    E("neighbor_average_on_integers", coll("    size = 1 MB\n    dtype = uint8", kind="neighbor_average"), "uint8", "neighbor_average takes a mean and needs a floating-point dtype"),
    E("shift_one_with_odd_rank_count", coll("    ranks = gpu[0..2]\n    size = 1 MB\n    peers = shift_one", kind="neighbor_average"), "shift_one", "needs an even rank count; got 3"),
    # sizes
    E("size_missing", coll("    dtype = float32", name="nosize"), "nosize", "collective nosize has no size"),
    E("size_not_a_multiple_of_dtype", coll("    size = 10 B\n    dtype = float64"), "10 B", "not a multiple of the float64 element size (8 B)"),
    E("size_zero", coll("    size = 0 MB"), "0 MB", "size must be positive"),
    E("size_negative", coll("    size = -4 KB"), "-4", "size must be positive"),
    E("size_not_whole_bytes", coll("    size = 1.5 B\n    dtype = uint8"), "1.5 B", "not a whole number of bytes"),
    # 4 ranks x 4 B = 16 B; 1000 B = 62.5 blocks of 16
    E("alltoall_size_not_a_multiple_of_ranks_times_dtype", coll("    size = 1000 B", kind="alltoall"), "1000 B", "multiple of ranks × float32 size = 4 × 4 B = 16 B"),
    E("chunk_not_a_multiple_of_dtype", coll("    size = 1 MB\n    chunk = 6 B"), "6 B", "chunk 6 B (6 B) is not a multiple"),
    E("chunk_must_be_a_size_or_auto", coll("    size = 1 MB\n    chunk = big"), "big", "(or auto)"),
    # connectivity
    E("unreachable_default_ranks_points_at_the_name", DISCONNECTED.replace("    g2 <-> g3 : nv\n", "")
      + "collective b = broadcast on d {\n    size = 1 MB\n}\n", "b =", "rank 'g3' cannot be reached from the root 'g0'", also=("{g0, g1, g2}",)),
    # g3 -> g4 only: g4 and g5 cannot send to g0
    E("reduce_needs_every_rank_to_reach_the_root", DISCONNECTED + "collective r = reduce on d {\n    size = 1 MB\n}\n", "r =", "rank 'g4' cannot reach the root 'g0'", also=("{g0, g1, g2, g3}",)),
    E("unrooted_kind_needs_strong_connectivity", DISCONNECTED + "collective a = allreduce on d {\n    ranks = g[2..5]\n    size = 1 MB\n}\n", "2..5", "an allreduce needs its ranks strongly connected: 'g4' cannot reach 'g2'", also=("{g2, g3}",)),
]


@pytest.mark.parametrize("src, needle, fragment, nth, skip, also", CASES)
def test_error_at_the_faulty_token(src, needle, fragment, nth, skip, also):
    e = check_at(src, needle, fragment, nth=nth, skip=skip)
    for piece in also:
        assert piece in e.message, e.render()


def test_syntax_unexpected_end_of_file():
    src = "topology t {\n    node a, b\n    a <-> b : 1 GB/s\n"
    e = check_error(src, 3, len("    a <-> b : 1 GB/s") + 1, "unexpected end of file")
    assert "'}'" in e.message


def test_syntax_expected_in_words_not_terminal_names():
    src = "topology t {\n    node 3a\n}\n"
    e = check_at(src, "3a", "expected a name")
    assert "NAME" not in e.message


# ---- names -------------------------------------------------------------------------------

def test_duplicate_topology():
    src = TOPO + "topology t {\n    node a\n}\n"
    check_error(src, 7, 10, "duplicate topology name 't'")


def test_duplicate_collective():
    src = coll("    size = 1 MB") + "collective c = broadcast on t {\n    size = 1 MB\n}\n"
    check_error(src, at(src, "collective c", 1)[0], len("collective ") + 1, "duplicate collective name 'c'")


def test_unknown_topology_name():
    src = coll("    size = 1 MB", topo="tt")
    e = check_at(src, "tt", "unknown topology 'tt'")
    assert "topologies: t" in e.hint


@pytest.mark.parametrize(
    "key, bad, good",
    [
        ("dtype", "float23", "float32"),
        ("op", "summ", "sum"),
        ("algorithm", "treepak", "treepack"),
        ("compress", "int9", "int8"),
        ("on_failure", "abrt", "abort"),
        ("adaptive", "of", "off"),
    ],
)
def test_unknown_enumerated_value(key, bad, good):
    src = coll(f"    size = 1 MB\n    {key} = {bad}")
    check_at(src, bad, f"did you mean {good}?")


# ---- links -------------------------------------------------------------------------------

# ---- units -------------------------------------------------------------------------------

# ---- ranks and root ----------------------------------------------------------------------

def test_rank_listed_twice():
    src = coll("    ranks = gpu[0..2], gpu1\n    size = 1 MB")
    e = check_at(src, "gpu1\n", "rank 'gpu1' is listed twice")
    line, col = at(src, "0..2")
    assert f"(first at line {line}, column {col})" in e.message


# ---- kind-specific keys ------------------------------------------------------------------

@pytest.mark.parametrize("codec", ["int8", "fp16"])
def test_compress_on_integers(codec):
    src = coll(f"    size = 1 MB\n    dtype = int64\n    compress = {codec}")
    check_at(src, codec, f"compress = {codec} is a lossy float encoding")


# ---- sizes -------------------------------------------------------------------------------

# ---- connectivity ------------------------------------------------------------------------



def test_unreachable_from_root_names_vertex_and_cut():
    src = DISCONNECTED + "collective b = broadcast on d {\n    ranks = g[0,1,3,4]\n    size = 1 MB\n}\n"
    # g3 is reached only through g2, which is not a rank
    e = check_at(src, ",3,", "rank 'g3' cannot be reached from the root 'g0'", skip=1)
    assert "{g0, g1}" in e.message and "capacity 0" in e.message
    assert "g2" in e.hint and "not a rank" in e.hint


def test_broadcast_over_a_one_way_link_is_fine():
    src = DISCONNECTED + "collective b = broadcast on d {\n    size = 1 MB\n}\n"
    assert load_program(src).collectives[0].ranks == tuple(f"g{i}" for i in range(6))


def test_switches_forward_for_a_collective():
    src = TOPO + "collective a = allreduce on t {\n    ranks = gpu0, gpu3\n    size = 1 MB\n}\n"
    assert load_program(src).collectives[0].ranks == ("gpu0", "gpu3")


# ---- files -------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(SourceError) as info:
        load_program(tmp_path / "nope.hcl")
    assert "cannot read" in info.value.message
    for missing in ("no/such/plan.hcl", "plan.hcl", str(tmp_path)):  # a directory too
        with pytest.raises(SourceError) as info:
            load_program(missing)
        assert info.value.message.startswith(f"cannot read {missing}: ")
        assert info.value.render() == f"{missing}: error: {info.value.message}"


def test_errors_carry_the_file_path(tmp_path):
    p = tmp_path / "bad.hcl"
    p.write_text(coll("    size = 3 B"))
    with pytest.raises(SourceError) as info:
        load_program(str(p))
    line, col = at(p.read_text(), "3 B")
    assert info.value.render().startswith(f"{p}:{line}:{col}: error: ")


def test_syntax_missing_closing_brace_hints_at_it():
    src = "topology t {\n  node a, b\n  a <-> b : 1 GB/s\n\ncollective c = allreduce on t {\n  size = 1 MB\n}\n"
    e = check_at(src, "c =", "unexpected name 'c'")
    assert e.hint == "is a '}' missing before 'collective' on line 5?"


# ---- never a traceback: any edit of a valid program loads or fails with a SourceError --------

DEMO = (Path(__file__).resolve().parent.parent / "samples" / "dgx1_fragmented.hcl").read_text()
PIECES = list("{}[]=,.:#-<>x09 \n/") + ["..", "<->", "->", "node ", "host ", "collective ", " on ", "GB/s", "us"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(DEMO)), st.integers(0, 6), st.sampled_from(PIECES)),
                min_size=1, max_size=3))
def test_edited_programs_load_or_fail_cleanly(edits):
    src = DEMO
    for at_, cut, piece in edits:
        at_ = min(at_, len(src))
        src = src[:at_] + piece + src[at_ + cut:]
    try:
        load_program(src)
    except SourceError as e:
        lines = src.splitlines()
        assert 1 <= e.span.line <= max(1, len(lines))
        assert 1 <= e.span.col <= len(lines[e.span.line - 1] if lines else "") + 1
        assert e.render().startswith(f"<string>:{e.span.line}:{e.span.col}: error: ")


def test_syntax_missing_comma_in_a_list_hints_at_it():
    src = coll("    ranks = gpu0 gpu1\n    size = 1 MB")
    e = check_at(src, "size", "unexpected name 'size'; expected '='")
    assert e.hint == "is a ',' missing before 'gpu1', or an '=' after it?"


# ---- the Python API's own arguments (issue 21) -------------------------------------------------

API_SRC = "topology t { node a, b, c  a <-> b : 1 GB/s  b <-> c : 1 GB/s }\n" \
          "collective r = allreduce on t { size = 4 KB }\n"


@pytest.mark.parametrize("call, kind, fragment", [
    (lambda hcc, p: hcc.compile(p, 123), TypeError, "name must be a collective's name (str) or None, got int"),
    (lambda hcc, p: hcc.compile(123), TypeError, "program must be a Program, a path or source text, got int"),
    (lambda hcc, p: hcc.compile(p, model=3), TypeError, "model must be a CostModel or None, got int"),
    (lambda hcc, p: hcc.compile(p, modle=None), TypeError, "unexpected keyword argument 'modle' (did you mean 'model'?)"),
    (lambda hcc, p: hcc.compile_all(p, nme="r"), TypeError, "unexpected keyword argument 'nme'"),
    (lambda hcc, p: hcc.compile_all(None), TypeError, "program must be a Program"),
    (lambda hcc, p: hcc.load(None), TypeError, "hcc.load: expected a path or the program's source text"),
    (lambda hcc, p: hcc.load(b"topology t {}"), TypeError, "got bytes"),
    (lambda hcc, p: hcc.load(API_SRC, strict=True), TypeError, "unexpected keyword argument 'strict'"),
    (lambda hcc, p: hcc.Plan.load(None), TypeError, "expected a path"),
    (lambda hcc, p: hcc.CostModel(per_message_s=-1), ValueError, "per_message_s must be a finite number >= 0, got -1"),
    (lambda hcc, p: hcc.CostModel(per_message_s=float("nan")), ValueError, "got nan"),
    (lambda hcc, p: hcc.CostModel(reduce_Bps=float("inf")), ValueError, "got inf"),
    (lambda hcc, p: hcc.CostModel(copy_Bps="fast"), TypeError, "copy_Bps must be a number, got str"),
    (lambda hcc, p: hcc.CostModel(per_message_s=True), TypeError, "got bool"),
])
def test_api_misuse_is_a_typed_error(call, kind, fragment):
    """Wrong argument types and values used to give a raw TypeError ("'int' object is not
    iterable"), a false "deadlock" (a negative per-message cost) or a silent 0.0 s prediction
    (NaN); each is now an hcc error that is also the built-in TypeError/ValueError."""
    import hcc

    program = hcc.load(API_SRC)
    with pytest.raises(hcc.ArgumentError) as e:
        call(hcc, program)
    assert isinstance(e.value, kind) and isinstance(e.value, hcc.HccError)
    assert fragment in str(e.value), str(e.value)


def test_api_accepts_what_it_documents():
    import numpy as np

    import hcc

    program = hcc.load(API_SRC)
    plan = hcc.compile(program, "r", model=hcc.CostModel(per_message_s=np.float64(1e-6)))
    assert plan.figures.predicted_s > 0
    assert set(hcc.compile_all(API_SRC, model=None)) == {"r"}


# -- the compiler's named forms (frontend.NAMED_FORMS) ---------------------------------------------
LEVELS_TOPO = """\
topology t {
    host h[0..2] {
        node g[0..1]
        switch sw, nic[0..1]
        g[0..1] <-> sw : 100 GB/s, 1 us
        g0 <-> nic0 : 10 GB/s, 1 us
        g1 <-> nic1 : 10 GB/s, 1 us
    }
    switch ib
    h[0..2].nic[0..1] <-> ib : 10 GB/s, 2 us
}
"""


def test_a_named_form_is_forced_by_its_name_with_underscores():
    from hcc.compiler.pipeline import compile_one

    for kind in ("allreduce", "allgather"):
        src = LEVELS_TOPO + f"collective c = {kind} on t {{\n    size = 6 MiB\n    algorithm = treepack_levels\n}}\n"
        plan = compile_one(load_program(src))
        assert plan.algorithm == "treepack-levels"
        plan.verify()


def test_a_named_form_of_another_kind_is_refused_at_its_value():
    e = check_at(coll("    size = 1 MiB\n    algorithm = treepack_wide"), "treepack_wide",
                 "algorithm treepack_wide does not schedule allreduce (it schedules broadcast, reduce)")
    assert "algorithm = auto" in e.hint


def test_a_named_form_past_its_rank_limit_is_refused_at_its_value():
    src = ("topology t {\n    node gpu[0..11]\n    switch sw\n    gpu[0..11] <-> sw : 10 GB/s, 1 us\n}\n"
           "collective c = allreduce on t {\n    size = 12 MiB\n    algorithm = treepack_split\n}\n")
    check_at(src, "treepack_split", "algorithm treepack_split does not take allreduce over 12 ranks")


def test_a_named_form_without_a_layout_here_is_refused_at_the_collective():
    # one switch, no hosts: no two-level layout; the error points at the collective
    from hcc.compiler.pipeline import compile_one

    src = coll("    size = 1 MiB\n    algorithm = treepack_levels")
    with pytest.raises(SourceError) as info:
        compile_one(load_program(src))
    e = info.value
    assert (e.span.line, e.span.col) == at(src, "collective c")
    assert "algorithm treepack_levels has no form of this allreduce on topology t" in e.message


def test_a_misspelled_form_gets_a_caret_and_the_listed_names():
    e = check_at(coll("    size = 1 MiB\n    algorithm = treepack_levelz"), "treepack_levelz",
                 "unknown algorithm 'treepack_levelz' (did you mean treepack_levels?)")
    assert "treepack_rsag" in e.hint



def _load_in_worker(src: str):
    return load_program(src)


def test_errors_cross_a_process_boundary_whole():
    """An error raised in another process (a multiprocessing pool, a Ray task) is pickled back
    to the caller: it must arrive as the same error, with its span, rendering and attributes,
    not as a pickling failure (the default rebuilds it from its message alone)."""
    import pickle
    from concurrent.futures import ProcessPoolExecutor

    from hcc.backends.base import BackendUnavailable, CollectiveTimeout, PeerFailed, RankFailed
    from hcc.backends.launch import RunFailed
    from hcc.ir.errors import PlanError, VerifyError

    src = "topology t {\n  node a[\n}\n"
    with pytest.raises(SourceError) as here:
        load_program(src)
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(SourceError) as there:
            pool.submit(_load_in_worker, src).result(timeout=120)
    assert there.value.render() == here.value.render()
    assert (there.value.span, there.value.hint) == (here.value.span, here.value.hint)
    for err in (PlanError("no trees", "plan.json"), VerifyError("deadlock", "plan.json", 3, 7),
                PeerFailed(0, 2, "reset"), CollectiveTimeout(1, 0, "recv", 2.5), RankFailed(3, by=1),
                BackendUnavailable("mpi", "mpi4py", "mpi"), RunFailed("sockets", {1: "boom"})):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__
