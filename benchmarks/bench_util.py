"""Small pieces the benchmark scripts share (imported from beside them: each script runs as
``python benchmarks/NAME.py``, which puts this folder on ``sys.path``).

Terms
- *topology text*: a topology in hcc's language built line by line: its header and host
  blocks, then, on more than one host, the switches joining the hosts and their links
  (:func:`close_topology`).
- *option table*: a script's command-line options as ``(flags, keywords)`` pairs for
  ``argparse.ArgumentParser.add_argument`` (:func:`parser`).
- *results file*: a CSV under benchmarks/results, written whole or not at all
  (:func:`write_csv`).
"""
from __future__ import annotations

import argparse
from typing import Iterable, Sequence


def close_topology(lines: Sequence[str], switches: str = "", links: Sequence[str] = (), indent: str = "    ") -> str:
    """The text of a topology whose header and host blocks are ``lines``: when ``links`` is not
    empty, ``switch <switches>`` and those links join the hosts; then the closing brace.

    >>> print(close_topology(["topology t {", "    node a, b"], "s", ["    a <-> s : 1 GB/s", "    b <-> s : 1 GB/s"]))
    topology t {
        node a, b
        switch s
        a <-> s : 1 GB/s
        b <-> s : 1 GB/s
    }
    """
    out = list(lines)
    if links:
        out.append(f"{indent}switch {switches}")
        out += links
    out.append("}")
    return "\n".join(out)


def parser(description: str, options: Iterable[tuple[tuple[str, ...], dict]]) -> argparse.ArgumentParser:
    """An argument parser with ``description`` and the options of an option table.

    >>> parser("demo", [(("--n",), {"type": int, "default": 2})]).parse_args([]).n
    2
    """
    ap = argparse.ArgumentParser(description=description)
    for flags, kw in options:
        ap.add_argument(*flags, **kw)
    return ap


def write_csv(path, fields: Sequence[str], rows: Iterable[dict]) -> None:
    """``rows`` as CSV with the header ``fields``, replacing ``path`` whole (a run stopped
    midway leaves the previous file)."""
    import csv
    import io

    from hcc.ir.files import atomic_write_text

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())
