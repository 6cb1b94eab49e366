"""The 3xTF32 tensor-core TSM2 kernel (matplan/kernels/tsm2_tc.py) against NumPy float64 on fresh
random data, NaN-poisoned outputs (GPU only; skipped without CuPy)."""
import numpy as np
import pytest
from conftest import check_dense_product, nonzero_random as _random

from matplan.kernels.tsgemm import tsm2_tc

pytestmark = pytest.mark.gpu

#: 3xTF32 drops a_lo * b_lo (< 2^-22 |a b|) and rounds the low parts, and each tile's mma sums go
#: into float32 sums (FL): within 5e-6 of |A| @ |B|, a tenth of the float32 kernels' bound
#: (test_tsm2_gpu: 2e-5 x 8).
RTOL = 5e-6


def _run(cp, A, B, **kw):
    out = cp.full((A.shape[0], B.shape[1]), cp.nan, dtype=cp.float32)
    C = tsm2_tc.matmul(A, B, out=out, **kw)
    assert C is out
    return C


@pytest.mark.parametrize("variant", sorted(tsm2_tc.VARIANTS))
@pytest.mark.parametrize("k", (1, 3, 8, 9, 16, 17, 32, 33, 64))
@pytest.mark.parametrize("order", ["C", "F"])
def test_tc_matches_numpy(cp, rng, variant, k, order):
    m, n = 1532, 1000 + 36          # m, n multiples of 4 (16-byte rows / columns), of no tile
    A_h, B_h = _random(rng, (m, n), np.float32), _random(rng, (n, k), np.float32)
    A = cp.asarray(A_h, order=order)
    if variant not in tsm2_tc.variants("row" if order == "C" else "col"):
        with pytest.raises(ValueError, match="^variant: .* for col-major A"):
            _run(cp, A, cp.asarray(B_h), variant=variant)
        return
    C = _run(cp, A, cp.asarray(B_h), variant=variant)
    check_dense_product(C, A_h, B_h, RTOL)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("slices", (1, 3, 7))
def test_tc_split_and_edges(cp, rng, order, slices):
    """Split over n (forced slice counts, the last slice partial), m below one block and not a
    multiple of 4 rows in column-major A (the scalar loads), n not a multiple of 16."""
    for m, n, k in ((5, 4 * 333, 32), (1532, 4 * 251, 24), (301, 4 * 1030, 40)):
        A_h, B_h = _random(rng, (m, n), np.float32), _random(rng, (n, k), np.float32)
        if order == "C":
            A = cp.asarray(A_h)
        else:   # a view of m rows of an F-ordered array whose columns start 16 bytes apart
            A = cp.asfortranarray(cp.asarray(np.pad(A_h, ((0, -m % 4), (0, 0)))))[:m]
        C = _run(cp, A, cp.asarray(B_h), slices=slices)
        check_dense_product(C, A_h, B_h, RTOL)


def test_tc_strided_b_and_c(cp, rng):
    """B a view with row stride > k, C a strided view: the kernel reads and writes through strides."""
    m, n, k = 700, 512, 20
    A_h = _random(rng, (m, n), np.float32)
    Bw = _random(rng, (n, 2 * k), np.float32)
    B_h = Bw[:, 3:3 + k]
    A = cp.asarray(A_h)
    base = cp.full((m, 2 * k), cp.nan, dtype=cp.float32)
    out = base[:, ::2]
    C = tsm2_tc.matmul(A, cp.asarray(Bw)[:, 3:3 + k], out=out)
    assert C is out
    check_dense_product(C, A_h, B_h, RTOL)
    assert bool(cp.isnan(base[:, 1::2]).all())     # nothing outside the view written


def test_tc_accuracy_is_float32(cp, rng):
    """Wide-range values (exponents over 2^-20..2^20): the error stays at float32 level, which
    plain TF32 (10-bit mantissa) would miss by orders of magnitude."""
    m, n, k = 1024, 4096, 32
    A_h = (_random(rng, (m, n), np.float64) * 2.0 ** rng.integers(-20, 20, (m, n))).astype(np.float32)
    B_h = _random(rng, (n, k), np.float32)
    C = tsm2_tc.matmul(cp.asarray(A_h), cp.asarray(B_h)).get().astype(np.float64)
    ref = A_h.astype(np.float64) @ B_h.astype(np.float64)
    bound = np.abs(A_h.astype(np.float64)) @ np.abs(B_h.astype(np.float64))
    assert np.max(np.abs(C - ref) / bound) < 1e-6


def test_tc_accuracy_at_tiny_scale(cp, rng):
    """Values near 2^-100 (products near 2^-100) keep float32 accuracy. Below ~2^-110 they do not:
    TF32's subnormal step is 2^-136 where float32's is 2^-149, so the split's low parts lose
    bits (H100: 1.6e-5 of |A| @ |B| at 2^-115, tsm2-tc-default-h100-2026-11-24-43101dd.log)."""
    m, n, k = 512, 2048, 32
    A_h = (_random(rng, (m, n), np.float64) * 2.0 ** -100).astype(np.float32)
    B_h = _random(rng, (n, k), np.float32)
    check_dense_product(tsm2_tc.matmul(cp.asarray(A_h), cp.asarray(B_h)), A_h, B_h, RTOL)


def test_tc_is_deterministic(cp, rng):
    A = cp.asarray(_random(rng, (2000, 4096), np.float32))
    B = cp.asarray(_random(rng, (4096, 32), np.float32))
    first = tsm2_tc.matmul(A, B)
    for _ in range(3):
        assert bool((tsm2_tc.matmul(A, B) == first).all())


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("slices", (1, 3))
def test_tc_nonfinite_like_fp32(cp, rng, order, slices):
    """Inf, -Inf and NaN in A and B, Inf meeting a zero of B, and a finite value past the largest
    TF32 (its high part rounds to Inf): C has IEEE float32's Inf, -Inf and NaN exactly where the
    float64 sum of products has them (the store's FP32 path), and every other element within RTOL;
    the output is poisoned with a finite sentinel, so an element left unwritten shows too."""
    m, n, k = 96, 4 * 130, 24
    A_h = _random(rng, (m, n), np.float32)
    B_h = _random(rng, (n, k), np.float32) * np.float32(1e-3)   # keeps 3.4e38 * b finite
    A_h[3, 10], A_h[7, 200], A_h[11, 300], A_h[20, 40] = np.inf, -np.inf, np.nan, 3.4e38
    B_h[10, 4] = 0.0                                           # row 3, column 4: Inf * 0
    B_h[5, 2], B_h[450, 7] = np.inf, np.nan                    # columns 2 and 7
    for variant in tsm2_tc.variants("row" if order == "C" else "col"):
        out = cp.full((m, k), 12345.0, dtype=cp.float32)
        got = tsm2_tc.matmul(cp.asarray(A_h, order=order), cp.asarray(B_h), out=out, variant=variant,
                             slices=slices).get().astype(np.float64)
        A64, B64 = A_h.astype(np.float64), B_h.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):   # IEEE: the products one by one, summed
            ref = (A64[:, :, None] * B64[None, :, :]).sum(axis=1)
        for name, f in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
            assert np.array_equal(f(got), f(ref)), f"{variant}: {name} at {np.argwhere(f(got) != f(ref))[:5]}"
        assert np.isnan(ref[3, 4]) and np.isnan(ref[:, 7]).all() and np.isfinite(ref[20, [0, 1, 3]]).all()
        fin = np.isfinite(ref)
        bound = np.abs(np.where(np.isfinite(A64), A64, 0)) @ np.abs(np.where(np.isfinite(B64), B64, 0))
        assert (np.abs(got[fin] - ref[fin]) <= RTOL * bound[fin] + 1e-30).all(), variant


def test_tc_rejects_bad_inputs(cp, rng):
    A = cp.asarray(_random(rng, (64, 258), np.float32))        # rows of 1032 bytes: not 16-byte multiples
    B = cp.asarray(_random(rng, (258, 16), np.float32))
    with pytest.raises(ValueError, match="16-byte"):
        tsm2_tc.matmul(A, B)
    with pytest.raises(ValueError, match="float32 only"):
        tsm2_tc.matmul(cp.asarray(_random(rng, (64, 256), np.float64)), cp.asarray(_random(rng, (256, 8), np.float64)))
    with pytest.raises(ValueError, match="variant"):
        tsm2_tc.matmul(cp.asarray(_random(rng, (64, 256), np.float32)), B[:256], variant="nope")
    with pytest.raises(ValueError, match="^A, B: expected"):
        tsm2_tc.matmul(A[:, :256], B)


def _fresh_tuning(monkeypatch, tmp_path, enabled):
    """tsm2_tc.ENABLED set, an empty measurement cache, and the list of its new entries."""
    from matplan.planner import measure_cache as mc
    monkeypatch.setattr(tsm2_tc, "ENABLED", enabled)
    monkeypatch.setenv(mc.CACHE_ENV, str(tmp_path / f"m{int(enabled)}.sqlite"))
    monkeypatch.setattr(mc, "_CACHES", {})
    got = []
    monkeypatch.setattr(mc, "LISTENERS", [got.extend])
    return got


@pytest.mark.parametrize("order", ["C", "F"])
def test_planner_times_tc_only_when_enabled(cp, rng, monkeypatch, tmp_path, order):
    """The planner's measurement of TSM2 tries every tsm2_tc variant for float32 k in TC_K when
    ENABLED (the default) and none otherwise; a plan that carries a tc variant runs it through
    plan.run (kept launch) and matches NumPy in a NaN-poisoned output; its why names the kernel
    when it won."""
    import dataclasses
    from matplan import planner
    from matplan.kernels.tsgemm import rules
    m, n, k = 1024, 2048, 32
    A_h, B_h = _random(rng, (m, n), np.float32), _random(rng, (n, k), np.float32)
    A, B = cp.asarray(A_h, order=order), cp.asarray(B_h)
    for enabled in (False, True):
        timed = _fresh_tuning(monkeypatch, tmp_path, enabled)
        plan = planner.plan(A, B, kernels=["tsgemm.tsm2"])
        tc = sorted(e.key.config.params()["tc"] for e in timed if "tc" in e.key.config.params())
        assert tc == (sorted(tsm2_tc.variants(rules.layout_of(A)[0])) if enabled else [])
        if plan.params.get("tc"):
            assert "3xTF32" in next(c for c in plan.candidates if c.kernel == "tsgemm.tsm2").why
    forced = dataclasses.replace(plan, params={**plan.params, "tc": "d1"})
    for _ in range(2):   # the second call launches the kept launch
        out = cp.full((m, k), cp.nan, dtype=cp.float32)
        assert forced.run(A, B, out=out) is out
        check_dense_product(out, A_h, B_h, RTOL)
    A_h[7, 100] = np.inf   # through plan.run too: the row an Inf meets is +-Inf (B has no zeros), not NaN
    A = cp.asarray(A_h, order=order)
    C = forced.run(A, B).get()
    assert (np.isinf(C[7]) & (np.sign(C[7]) == np.sign(B_h[100]))).all()
    assert np.isfinite(np.delete(C, 7, axis=0)).all()


def test_tc_plan_rejects_unaligned_a(cp, rng):
    """A plan with the tc kernel refuses, naming A, an A whose rows are not 16-byte aligned."""
    from matplan.kernels import get
    A = cp.asarray(_random(rng, (64, 258), np.float32))
    with pytest.raises(ValueError, match="^A: the tensor-core"):
        get("tsgemm.tsm2").prepare(A, {"layout": "row", "t1": 256, "t2": 32, "t3": 1, "tc": "d1"})
