"""A launched rank frees what one collective kept before the next (backends/launch.py
``_release_memory``): the staging pool's kept arrays go, so a rank does not carry up to
256 MiB of one collective's early frames into the next."""
from __future__ import annotations

import numpy as np


def test_release_memory_empties_the_staging_pool():
    from hcc.backends.kernels import STAGING
    from hcc.backends.launch import _release_memory

    a = STAGING.take(1 << 20, np.dtype(np.float32))
    STAGING.give(a)
    assert STAGING._kept >= a.nbytes
    _release_memory()
    assert STAGING._kept == 0
    b = STAGING.take(1 << 20, np.dtype(np.float32))  # a new array, not the one given back
    assert not np.shares_memory(a, b)
