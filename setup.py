"""Build hcc's native parts with the machine's C compiler.

Everything else about the package is in pyproject.toml; setuptools merges the two. Nothing is
downloaded at build time: the extensions need only the Python headers and gcc (or clang).
Set ``HCC_NO_NATIVE=1`` to skip them: every one has a pure-Python path the runtime and the
compiler then use.
"""
import os

from setuptools import Extension, setup

# (module, source, extra flags beyond -O3 -std=gnu11 -Wall); gnu11 for _Float16 and stdatomic
NATIVE = (
    # the native core: shared memory, the executor loop, the vectorised reductions
    ("hcc.backends._native", "backends/_native.c", ["-fno-strict-aliasing", "-Wno-unused-function"]),
    # the native core's TCP data plane (backends/native_tcp.py); it takes _native's kernels
    ("hcc.backends._native_tcp", "backends/_native_tcp.c", []),
    # the simulator's event loop (compiler/cost.py runs its Python reference without it);
    # no fused multiply-add, so its sums round exactly as the reference's do
    ("hcc.compiler._simcore", "compiler/_simcore.c", ["-ffp-contract=off"]),
    # a plan's op fields read into arrays in one pass (ir/opscan.py: the simulator and the
    # verifier's fast path; both keep a Python path without it)
    ("hcc.ir._opscan", "ir/_opscan.c", []),
    # the verifier's races, deadlock order, symbolic execution and final check over those
    # arrays (ir/verify_native.py; ir/verify.py's Python checks run without it)
    ("hcc.ir._verifycore", "ir/_verifycore.c", []),
)

ext_modules = [] if os.environ.get("HCC_NO_NATIVE") else [
    Extension(name, sources=[src], extra_compile_args=["-O3", "-std=gnu11", "-Wall", *flags])
    for name, src, flags in NATIVE
]

setup(ext_modules=ext_modules)
