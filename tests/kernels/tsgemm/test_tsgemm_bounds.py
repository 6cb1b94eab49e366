"""benchmarks/tsgemm_bounds.py: the bound of a kernel at the copy bandwidth, on a hand-made report."""
import importlib.util
import math
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "tsgemm_bounds", Path(__file__).resolve().parents[3] / "benchmarks" / "tsgemm_bounds.py")
bounds_mod = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bounds_mod)


def test_bounds_against_hand_computed_figures():
    bw = 1e12                                       # bytes/s
    n = 1000
    ideal_ms = lambda k: (n * n + 2 * n * k) * 4 / bw * 1e3
    rows = [dict(n=n, k=k, dtype="float32", layout="F", vendor_ms=2 * ideal_ms(k), ms=ideal_ms(k) * f)
            for k, f in ((1, 1.25), (32, 2.5))]
    b = bounds_mod.bounds({"copy_bandwidth": bw, "rows": rows})
    got = b["float32/F"]
    assert got["bound"] == pytest.approx(2.0)                                   # cuBLAS at half the bandwidth
    assert got["bound_k32_parity"] == pytest.approx(math.sqrt(2.0 * 1.0))
    assert got["measured"] == pytest.approx(math.sqrt((2 / 1.25) * (2 / 2.5)))
    assert b["float32/F/1000"] == got
