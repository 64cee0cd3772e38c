"""Shared test helpers. Tests that start processes, MPI or Ray live in tests/runtime/ and are
marked ``slow``; they run in CI too."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


@pytest.fixture
def samples_dir() -> Path:
    return SAMPLES


def two_ranks(fn0, fn1, timeout: float = 10.0, shm: str | None = None):
    """Run ``fn0`` / ``fn1`` on ranks 0 / 1 of a real sockets job in two threads (loopback;
    ``shm="on"``: their data goes through the native core's shared-memory channels). Returns
    ``(results, errors)``, one entry per rank; an exception a rank raised is in ``errors``."""
    import threading

    from hcc.backends import sockets
    from hcc.backends.rendezvous import StoreServer

    server = StoreServer("tok")
    res, errs = [None, None], [None, None]

    def body(r, fn):
        try:
            with sockets.connect(r, 2, server.address, "tok", timeout=timeout, serve_store=False, shm=shm) as c:
                res[r] = fn(c)
        except Exception as e:  # collected for the assertions
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r, f)) for r, f in enumerate((fn0, fn1))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(3 * timeout)
    server.close()
    return res, errs
