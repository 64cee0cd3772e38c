"""Build hcc's native core (backends/_native.c) with the machine's C compiler.

Everything else about the package is in pyproject.toml; setuptools merges the two. Nothing is
downloaded at build time: the extension needs only the Python headers and gcc (or clang).
Set ``HCC_NO_NATIVE=1`` to skip it: the runtime then uses its pure-Python executor.
"""
import os

from setuptools import Extension, setup

ext_modules = []
if not os.environ.get("HCC_NO_NATIVE"):
    ext_modules.append(Extension(
        "hcc.backends._native",
        sources=["backends/_native.c"],
        # -O3: the reduction loops are vectorised; gnu11: _Float16 and stdatomic
        extra_compile_args=["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wall", "-Wno-unused-function"],
    ))
    # the native core's TCP data plane (backends/native_tcp.py); it takes _native's kernels
    ext_modules.append(Extension(
        "hcc.backends._native_tcp",
        sources=["backends/_native_tcp.c"],
        extra_compile_args=["-O3", "-std=gnu11", "-Wall"],
    ))

    # the simulator's event loop (compiler/cost.py runs its Python reference without it);
    # no fused multiply-add, so its sums round exactly as the reference's do
    ext_modules.append(Extension(
        "hcc.compiler._simcore",
        sources=["compiler/_simcore.c"],
        extra_compile_args=["-O3", "-std=gnu11", "-ffp-contract=off", "-Wall"],
    ))
    # a plan's op fields read into arrays in one pass (ir/opscan.py: the simulator and the
    # verifier's fast path; both keep a Python path without it)
    ext_modules.append(Extension(
        "hcc.ir._opscan",
        sources=["ir/_opscan.c"],
        extra_compile_args=["-O3", "-std=gnu11", "-Wall"],
    ))

    # the verifier's races, deadlock order, symbolic execution and final check over those
    # arrays (ir/verify_native.py; ir/verify.py's Python checks run without it)
    ext_modules.append(Extension(
        "hcc.ir._verifycore",
        sources=["ir/_verifycore.c"],
        extra_compile_args=["-O3", "-std=gnu11", "-Wall"],
    ))

setup(ext_modules=ext_modules)
