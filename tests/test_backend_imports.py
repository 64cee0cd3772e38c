"""Backends import their heavy dependency on first use and, when it is missing, say which
extra installs it (``pip install 'hcc[mpi]'``, ``'hcc[ray]'``)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hcc.backends.base import BackendUnavailable


def test_importing_hcc_and_every_backend_module_loads_no_heavy_dependency():
    code = ("import sys, hcc, hcc.backends.mpi, hcc.backends.ray, hcc.backends.sockets, hcc.backends.runtime, "
            "hcc.backends.testing; print(sorted(m for m in ('mpi4py', 'ray', 'matplotlib', 'torch') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_mpi4py_names_the_extra(monkeypatch):
    from hcc.backends import mpi

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # what an install without the extra sees
    with pytest.raises(BackendUnavailable, match=r"mpi4py.*pip install 'hcc\[mpi\]'") as e:
        mpi.MPIBackend()
    assert isinstance(e.value, ImportError) and e.value.extra == "mpi"
    assert not mpi.available()


def test_missing_ray_names_the_extra(monkeypatch):
    from hcc.backends import ray as hray
    from hcc.backends.ray.transport import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(BackendUnavailable, match=r"pip install 'hcc\[ray\]'"):
        import_ray()
    assert not hray.available()
    with pytest.raises(BackendUnavailable, match=r"hcc\[ray\]"):
        hray.ActorGroup(2)
