"""The leave-family-out refit covers the SpGEMM hash and merge constants: on timings the models make
with known constants, the refit finds them, and leaves the fixed costs it does not fit alone; the
constants read off the timings otherwise take their fold's data."""
import types

import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core import device as device_mod
from matplan.core import features as stats
from matplan.core.validation import normalize
from matplan.kernels import get
from matplan.kernels.spgemm import kernel as hash_kernel
from matplan.models import spgemm as spgemm_model
from matplan.models import tsgemm as tsgemm_model
from matplan.tuning_db import refit
from matplan.tuning_db.dataset import Dataset, Row

DEVICE = device_mod.known("H100")
TRUE = {"spgemm.MERGE_FIXED_S": 0.3e-3, "spgemm.MERGE_ROUND_S": 40e-6,
        "spgemm.MERGE_BYTES_PER_PRODUCT": 250.0, "spgemm.MERGE_ROUND_BYTES": 120.0,
        "spgemm.HASH_ROW_BYTES": 300.0, "spgemm.HASH_TABLE_BYTES": 100.0,
        "spgemm.HASH_FIXED_S[one pass, direct]": 90e-6,
        "spgemm.HASH_FIXED_S[one pass, grouped]": 150e-6,
        "spgemm.HASH_BYTES[float64][0]": 35.0, "spgemm.HASH_BYTES[float64][1]": 20.0}


def _matrices():
    """SpGEMM operands of short and long rows, balanced and grouped, a few sizes."""
    rng = np.random.default_rng(3)
    out = []
    for n in (1500, 3000, 6000, 12000):
        out.append(sp.diags([1.0] * 5, [-2, -1, 0, 1, 2], shape=(n, n), format="csr"))   # balanced, direct
        lengths = rng.integers(1, 12, size=n)
        lengths[: n // 500] = 40                                               # grouped, direct
        rows = np.repeat(np.arange(n), lengths)
        cols = rng.integers(0, n, size=rows.size)
        out.append(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)))
        rows = np.concatenate([np.repeat(np.arange(n), 3), np.zeros(min(n, 3000), dtype=np.int64)])
        cols = np.concatenate([rng.integers(0, n, size=3 * n), np.arange(min(n, 3000))])
        out.append(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)))   # row 0 long: tables
    return out


def _dataset():
    problems, rows = {}, []
    with refit.installed(TRUE):
        for j, A in enumerate(_matrices()):
            fp = f"p{j}"
            f = stats.compute(normalize(A, A), DEVICE)
            problems[fp] = types.SimpleNamespace(fingerprint=fp, family=f"fam{j % 3}", features=f.to_dict(),
                                                 matrix=fp, op="spgemm", dtype="float64")
            for kernel, params in (("spgemm.hash", {"sort": True}), ("spgemm.merge", {})):
                rows.append(Row(fp, kernel, params, get(kernel).cost(f, params, DEVICE).run_s, 0.0))
    rows.sort(key=lambda r: (r.problem, r.kernel))
    return Dataset("H100", DEVICE, "NVIDIA H100 80GB HBM3", problems, rows, [], [], [])


def test_refit_finds_the_spgemm_constants_it_was_given():
    ds = _dataset()
    shipped = refit.current()
    got = refit.fit(ds)
    for label, value in TRUE.items():
        assert got[label] == pytest.approx(value, rel=1e-5), label
    # the hybrid's fixed cost is not refit; the two passes' is read off their smallest calls, which
    # the model made here with the shipped value
    assert not any("hybrid" in label for label in got)
    assert got["spgemm.HASH_FIXED_S[two passes]"] == pytest.approx(spgemm_model.HASH_FIXED_S["two passes"], rel=1e-6)
    # no product here is balanced past numeric_esc: that path's fixed cost keeps its shipped value
    label = "spgemm.HASH_FIXED_S[one pass, balanced]"
    assert got[label] == shipped[label] == spgemm_model.HASH_FIXED_S["one pass, balanced"]
    assert refit.current() == shipped


def test_read_off_constants_take_their_fold_data():
    """HASH_FIRST_EXTRA_S is the median preparation (a first call's excess) of the one-pass hash
    rows a fold trains on; COL_COLUMN_S is 0 in a fold without the column kernel's timings
    (test_report_held_out reads it off some)."""
    ds = _dataset()
    extra = {r.problem: 1e-4 * (1 + i) for i, r in enumerate(ds.rows) if r.kernel == "spgemm.hash"}
    ds.rows = [Row(r.problem, r.kernel, r.params, r.run_s, extra.get(r.problem, 0.0) if r.kernel == "spgemm.hash"
                   else 0.0) for r in ds.rows]
    one_pass = [extra[fp] for fp in extra
                if hash_kernel.hash_path(ds.features(fp), DEVICE.smem_per_block).startswith("one pass")]
    assert len(one_pass) >= 3
    got = refit.fit(ds)
    assert got["spgemm.HASH_FIRST_EXTRA_S"] == pytest.approx(float(np.median(one_pass)))
    assert got["tsgemm.COL_COLUMN_S"] == 0.0              # no TS-GEMM timing in this fold
    assert refit.current()["tsgemm.COL_COLUMN_S"] == tsgemm_model.COL_COLUMN_S > 0


def test_two_passes_fixed_cost_is_read_off_the_smallest_calls():
    """HASH_FIXED_S["two passes"]: the median excess of the fold's two-pass calls of at most
    TWO_PASSES_SMALLEST times the fewest products; larger calls do not move it."""
    from matplan import corpus
    problems, rows = {}, []
    for scale in (10, 11, 14):   # R-MAT products take the two passes
        A = corpus.rmat(scale=scale, edge_factor=16, seed=0)
        f = stats.compute(normalize(A, A), DEVICE)
        assert hash_kernel.hash_path(f, DEVICE.smem_per_block) == "two passes"
        fp = f"r{scale}"
        problems[fp] = types.SimpleNamespace(fingerprint=fp, family="rmat", features=f.to_dict(), matrix=fp,
                                             op="spgemm", dtype="float64")
        rows.append(Row(fp, "spgemm.hash", {"sort": True}, get("spgemm.hash").cost(f, {"sort": True}, DEVICE).run_s,
                        0.0))
    ds = Dataset("H100", DEVICE, "NVIDIA H100 80GB HBM3", problems, rows, [], [], [])
    products = {r.problem: ds.features(r.problem).products for r in rows}
    assert min(products["r11"], products["r14"]) > refit.TWO_PASSES_SMALLEST * products["r10"]
    label, shipped = "spgemm.HASH_FIXED_S[two passes]", spgemm_model.HASH_FIXED_S["two passes"]

    def shifted(problem, extra):
        return [Row(r.problem, r.kernel, r.params, r.run_s + (extra if r.problem == problem else 0.0), 0.0)
                for r in rows]
    assert refit._two_passes_fixed(ds, rows)[label] == pytest.approx(shipped, rel=1e-6)
    for larger in ("r11", "r14"):
        assert refit._two_passes_fixed(ds, shifted(larger, 1e-3))[label] == pytest.approx(shipped, rel=1e-6)
    assert refit._two_passes_fixed(ds, shifted("r10", 1e-3))[label] == pytest.approx(shipped + 1e-3, rel=1e-6)
    assert refit._two_passes_fixed(ds, []) == {}
