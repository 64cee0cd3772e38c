"""Hostile or huge input is refused early (issue 21, item 3): limits on vertices, hosts, range
sizes and links are checked on counts before anything is expanded; numbers are measured before
any arithmetic; line numbers follow the parser whatever the line separators; a file that is not
UTF-8 is refused at its first bad byte. Every refusal is a SourceError at file:line:col with a
caret and names the limit; through the CLI it is exit status 2.

Expected positions come from the test text itself (``at``), never from the implementation. The
hostile programs here hung or exhausted memory before these checks existed; now each is refused
in milliseconds, so none of these tests can pass by waiting."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hcc.compiler.frontend import MAX_HOSTS, MAX_LINKS, MAX_VERTICES, load_program
from hcc.grammar.diagnostics import SourceError

from test_errors import at, check_at, check_error


def refuse(src: str, needle: str, fragment: str, nth: int = 0) -> SourceError:
    return check_at(src, needle, fragment, nth)


# ---- vertices, hosts, ranges, links -------------------------------------------------------

def test_clique_over_65536_vertices_is_refused_before_expansion():
    src = "topology t {\n node g[0..65535]\n g[0..65535] <-> g[0..65535] : 1 GB/s\n}\n"
    e = refuse(src, "g[0..65535] <->", f"a topology has at most {MAX_LINKS}")
    assert f"makes {65536 * 65535} links" in e.message  # counted exactly, never built


def test_links_are_counted_exactly_at_the_limit(monkeypatch):
    """The count made before expansion is the number of arcs made, to the arc: with the limit
    lowered to 3 cliques of 10 (270 arcs), a third clique fits exactly and a fourth is refused.
    A self-overlapping `->` and a partial overlap are counted the same way."""
    from hcc.compiler import frontend

    monkeypatch.setattr(frontend, "MAX_LINKS", 270)
    clique = "g[0..9] <-> g[0..9] : 1 GB/s"
    ok = load_program(f"topology t {{ node g[0..9]\n {clique}\n {clique}\n {clique} }}")
    assert len(ok.topologies["t"].links) == 270
    src = f"topology t {{ node g[0..9]\n {clique}\n {clique}\n {clique}\n {clique}\n}}"
    refuse(src, clique, "makes 90 links, 360 in topology t; a topology has at most 270", nth=3)
    for stmt in ("g[0..5] -> g[3..9] : 1 GB/s", "g[0..5] <-> g[3..9] : 1 GB/s", "g[0..9] -> g[0..9] : 1 GB/s"):
        monkeypatch.setattr(frontend, "MAX_LINKS", 1 << 20)
        made = len(load_program(f"topology t {{ node g[0..9]\n {stmt} }}").topologies["t"].links)
        monkeypatch.setattr(frontend, "MAX_LINKS", made)
        load_program(f"topology t {{ node g[0..9]\n {stmt} }}")
        monkeypatch.setattr(frontend, "MAX_LINKS", made - 1)
        refuse(f"topology t {{ node g[0..9]\n {stmt} }}", stmt, f"makes {made} links")


def test_hosts_times_vertices_is_refused_before_expansion():
    src = "topology t {\n host h[0..65535] { node g[0..65535] }\n}\n"
    e = refuse(src, "h[0..65535]", f"a topology has at most {MAX_VERTICES}")
    assert "65536 × 65536" in e.message


def test_too_many_hosts():
    src = "topology t {\n host h[0..65535] { }\n host k[0..3] { }\n}\n"
    refuse(src, "k[0..3]", f"a topology has at most {MAX_HOSTS}")


def test_vertices_across_declarations():
    src = "topology t {\n node a[0..65535]\n node b[0..1]\n}\n"
    refuse(src, "node b", f"65538 in topology t; a topology has at most {MAX_VERTICES}")


def test_a_range_past_the_limit_names_it():
    src = "topology t {\n node g[0..70000]\n}\n"
    refuse(src, "0..70000", "names more than 65536 names (the limit per range)")


def test_a_qualified_reference_is_sized_before_expansion():
    src = ("topology t {\n host h[0..1] { node g[0..1] }\n h0.g0 <-> h1.g1 : 1 GB/s\n}\n"
           "collective c = allreduce on t {\n ranks = h[0..65535].g[0..65535]\n size = 1 MB\n}\n")
    refuse(src, "h[0..65535].g", f"names 4294967296 vertices; a topology has at most {MAX_VERTICES}")


def test_a_range_index_of_5000_digits():
    big = "1" + "0" * 5000
    src = f"topology t {{\n node g[0..{big}]\n}}\n"
    line, col = at(src, big)
    with pytest.raises(SourceError) as info:
        load_program(src)
    e = info.value
    assert (e.span.line, e.span.col) == (line, col)
    assert "at most 999999999" in e.message and "5001 digits" in e.message
    assert len(e.render().splitlines()[1]) < 200  # a window of the line, not 5000 characters


def test_a_multiplicity_of_many_digits():
    src = "topology t {\n node a, b\n a <-> b : 1 GB/s x99999999999999999999999\n}\n"
    refuse(src, "x999", "link multiplicity 99999999… (23 digits) is too large: at most 65536")


# ---- numbers ------------------------------------------------------------------------------

@pytest.mark.parametrize("number", ["1e999999999", "1e400", "2e308", "9" * 99 + "e300"])
def test_numbers_beyond_a_finite_float_are_refused_without_unbounded_work(number):
    src = f"topology t {{\n node a, b\n a <-> b : {number} GB/s\n}}\n"
    refuse(src, number, "beyond the largest finite float")


def test_a_number_of_too_many_digits():
    src = f"topology t {{\n node a, b\n a <-> b : {'1' * 101} B/s\n}}\n"
    refuse(src, "111", "a number of 101 digits; at most 100")


def test_a_vanishing_bandwidth_is_zero_not_a_hang():
    src = "topology t {\n node a, b\n a <-> b : 1e-999999999 GB/s\n}\n"
    refuse(src, "1e-999999999", "must be positive")


def test_bandwidth_limits():
    refuse("topology t {\n node a, b\n a <-> b : 0.5 B/s\n}\n", "0.5", "below the limit of 1 B/s")
    refuse("topology t {\n node a, b\n a <-> b : 1e7 TB/s\n}\n", "1e7", "above the limit of 10^18 B/s")
    refuse("topology t {\n node a, b\n a <-> b : 1e6 TB/s x2\n}\n", "x2", "above the limit of 10^18 B/s")
    refuse("topology t {\n node a, b\n class c = 1e6 TB/s\n a <-> b : c x2\n}\n", "x2",
           "above the limit of 10^18 B/s")
    load_program("topology t {\n node a, b\n a <-> b : 1e6 TB/s\n}\n")  # exactly the limit


def test_latency_limit():
    refuse("topology t {\n node a, b\n a <-> b : 1 GB/s, 3601 s\n}\n", "3601", "above the limit of 3600 s")


def test_a_size_that_passes_check_compiles():
    """``size = 1e25 B`` passed check and crashed compile (numpy cannot count its elements);
    now check refuses it with the limit."""
    src = "topology t {\n node a, b\n a <-> b : 1 GB/s\n}\ncollective c = broadcast on t { size = 1e25 B }\n"
    refuse(src, "1e25", "above the limit of 2^50 B")
    src = src.replace("size = 1e25 B", "size = 1 MB  chunk = 2e15 B")
    refuse(src, "2e15", "chunk 2e15 B is above the limit of 2^50 B")


# ---- line separators ------------------------------------------------------------------------

@pytest.mark.parametrize("sep", ["\f", "\v", "\x1c", "\x85", "\u2028", "\u2029"])
def test_line_numbers_whatever_the_separators(sep):
    """Only "\\n" ends a line for the parser; str.splitlines also splits at these, and used to
    show the wrong source line under the right line number."""
    src = f"topology t {{ # a comment{sep}goes on\n node a,{sep} b\n a <-> c : 1 GB/s\n}}\n"
    e = load_error(src)
    if sep == "\f":  # whitespace to HCL: the unknown vertex on line 3 is the fault
        assert (e.span.line, e.span.col) == (3, 8) and "unknown vertex 'c'" in e.message
    else:  # not whitespace to HCL: refused where it stands outside the comment, on line 2
        assert (e.span.line, e.span.col) == at(src, sep, nth=1) == (2, 9)
        assert "unexpected character" in e.message
    lines = e.render().splitlines()
    shown = src.split("\n")[e.span.line - 1]
    assert lines[1] == "    " + "".join(ch if ch.isprintable() else " " for ch in shown)
    assert lines[2].index("^") == 4 + e.span.col - 1


def test_crlf_and_lone_cr_count_as_newlines():
    crlf = "topology t {\r\n node a, b\r\n a <-> c : 1 GB/s\r\n}\r\n"
    e = load_error(crlf)
    assert (e.span.line, e.span.col) == (3, 8)
    assert e.render().splitlines()[1] == "     a <-> c : 1 GB/s"
    e = load_error(crlf.replace("\r\n", "\r"))  # old Mac files: what Python's file reading does
    assert (e.span.line, e.span.col) == (3, 8)


def load_error(src: str) -> SourceError:
    with pytest.raises(SourceError) as info:
        load_program(src)
    return info.value


# ---- files ------------------------------------------------------------------------------------

def test_binary_file_reported_at_first_bad_byte(tmp_path):
    p = tmp_path / "bin.hcl"
    p.write_bytes(b"topology t {\n node a, b\n \xff\xfe <-> b : 1 GB/s\n}\n")
    with pytest.raises(SourceError) as info:
        load_program(p)
    e = info.value
    assert (e.span.line, e.span.col) == (3, 2)
    assert "not UTF-8 text: byte 0xff" in e.message and "codec" not in e.message
    lines = e.render().splitlines()
    assert lines[0].startswith(f"{p}:3:2: error:")
    assert lines[2].index("^") == 4 + 1


def test_a_character_cut_at_the_end_of_a_multibyte_line(tmp_path):
    p = tmp_path / "cut.hcl"
    p.write_bytes("topology t {\n node é, \xc3".encode("utf-8", "surrogateescape")[:-2] + b"\xc3")
    with pytest.raises(SourceError) as info:
        load_program(p)
    # "é" is two bytes but one column: the column counts characters
    assert (info.value.span.line, info.value.span.col) == (2, 10), info.value.render()


def test_an_oversized_file_is_not_read_whole(tmp_path):
    p = tmp_path / "big.hcl"
    with open(p, "wb") as f:
        f.truncate((16 << 20) + 1)
    with pytest.raises(SourceError, match="larger than 16777216 bytes"):
        load_program(p)


def test_cli_exit_2_with_caret(tmp_path):
    p = tmp_path / "hostile.hcl"
    p.write_text("topology t {\n host h[0..65535] { node g[0..65535] }\n}\n")
    r = subprocess.run([sys.executable, "-m", "hcc", "check", str(p)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    first, _line, caret = r.stderr.splitlines()[:3]
    assert first.startswith(f"{p}:2:7: error:") and "at most 65536" in first
    assert caret == "    " + " " * 6 + "^" * len("h[0..65535]")
    assert "Traceback" not in r.stderr
