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
