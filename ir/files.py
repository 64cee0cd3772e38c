"""hcc.ir.files — atomic writes: a failed run never leaves a half-written file."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then rename over
    ``path``; on any failure the temporary file is removed and ``path`` is untouched."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(data, (bytes, bytearray, memoryview)):
        from .errors import ArgumentTypeError

        raise ArgumentTypeError(f"cannot write {type(data).__name__} to {path!r}: expected a path "
                                "(str or os.PathLike) and bytes")
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".part", dir=p.parent or ".")
    try:
        # mkstemp makes the file 0600; a plan or picture is an ordinary file (0666 less umask)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    if not isinstance(text, str):
        from .errors import ArgumentTypeError

        raise ArgumentTypeError(f"cannot write {type(text).__name__} as text to {path!r}")
    atomic_write_bytes(path, text.encode("utf-8"))
