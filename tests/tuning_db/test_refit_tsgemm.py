"""The leave-family-out refit covers cuBLAS's and TSM2's costs on tall-and-skinny products: on
timings the models make with known constants, the refit finds cuBLAS's efficiencies and fixed
cost and TSM2's fixed cost; the shipped fixed costs are 0 (the planner's costs as before)."""
import types

import pytest

from matplan.core import device as device_mod
from matplan.core.features import Features
from matplan.kernels import get
from matplan.models import tsgemm as tsgemm_model
from matplan.tuning_db import refit
from matplan.tuning_db.dataset import Dataset, Row

DEVICE = device_mod.known("H100")
TRUE = {"tsgemm.CUBLAS_TS_EFFICIENCY[float32]": 0.55, "tsgemm.CUBLAS_TS_EFFICIENCY[float64]": 0.9,
        "tsgemm.CUBLAS_TS_FIXED_S[gemv]": 9e-6, "tsgemm.CUBLAS_TS_FIXED_S[gemm]": 18e-6,
        "tsgemm.TSM2_FIXED_S": 12e-6}
TSM2 = {"layout": "row", "t1": 256, "t2": 4, "t3": 2}


def _dataset():
    problems, rows = {}, []
    with refit.installed(TRUE):
        for j, (m, n, k, dtype) in enumerate((m, n, k, d) for m, n in ((4096, 4096), (65536, 1024), (16384, 16384))
                                             for k in (1, 8, 32) for d in ("float32", "float64")):
            fp = f"t{j}"
            f = Features(op="tsgemm", backend="gpu", dtype=dtype, index_dtype="", m=m, n=n, k=k, layout="C",
                         density=1.0, nnz=m * n)
            problems[fp] = types.SimpleNamespace(fingerprint=fp, family=f"fam{j % 2}", features=f.to_dict(),
                                                 matrix=fp, op="tsgemm", dtype=dtype)
            for kernel, params in (("gemm.cublas", {}), ("tsgemm.tsm2", TSM2)):
                rows.append(Row(fp, kernel, params, get(kernel).cost(f, params, DEVICE).run_s, 0.0))
    return Dataset("H100", DEVICE, "NVIDIA H100 80GB HBM3", problems, rows, [], [], [])


def test_refit_finds_the_tall_and_skinny_constants_it_was_given():
    shipped = refit.current()
    got = refit.fit(_dataset())
    for label, value in TRUE.items():
        assert got[label] == pytest.approx(value, rel=1e-5), label
    assert refit.current() == shipped
    assert tsgemm_model.CUBLAS_TS_FIXED_S == {"gemv": 0.0, "gemm": 0.0} and tsgemm_model.TSM2_FIXED_S == 0.0


def test_vendor_cost_reads_the_constants_at_each_call():
    """gemm.cublas's cost follows a refit (it once bound the efficiencies at import)."""
    f = Features(op="tsgemm", backend="gpu", dtype="float32", index_dtype="", m=4096, n=4096, k=8, layout="C",
                 density=1.0, nnz=4096 * 4096)
    before = get("gemm.cublas").cost(f, {}, DEVICE).run_s
    with refit.installed({"tsgemm.CUBLAS_TS_FIXED_S[gemm]": 1e-3}):
        assert get("gemm.cublas").cost(f, {}, DEVICE).run_s == pytest.approx(before + 1e-3)
    with refit.installed({"tsgemm.TSM2_FIXED_S": 1e-3}):
        assert get("tsgemm.tsm2").cost(f, TSM2, DEVICE).run_s > 1e-3
