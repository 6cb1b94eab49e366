"""TSM2 CUDA kernels against NumPy float64 on fresh random data (GPU only; skipped without CuPy)."""
import dataclasses

import numpy as np
import pytest
from conftest import check_dense_product, nonzero_random as _random

from matplan import planner
from matplan.kernels import get
from matplan.kernels.tsgemm import launch, rules, tsm2
from matplan.kernels.tsgemm.configs import TSM2Config
from matplan.planner import measure_cache as mc

pytestmark = pytest.mark.gpu

KS = (1, 2, 3, 8, 16, 33, 64)
DTYPES = (np.float32, np.float64)
#: Error allowed relative to (|A| @ |B|): a few rounding errors per term of the sum.
RTOL = {np.float32: 2e-5, np.float64: 1e-13}


def _check(C, A_host, B_host, dtype):
    check_dense_product(C, A_host, B_host, RTOL[dtype] * 8)


def _run(cp, A, B, params, out_shape=None):
    """Run the kernel with explicit params into a NaN-poisoned output."""
    k = get("tsgemm.tsm2")
    prep = k.prepare(A, params)
    shape = out_shape or ((A.shape[0],) if B.ndim == 1 else (A.shape[0], B.shape[1]))
    out = cp.full(shape, cp.nan, dtype=A.dtype)
    C = k.run(prep, B, out=out)
    assert C is out
    return C


def _params(layout, dtype, k, t1, t2=None, t3=4):
    t2, t3 = rules.kernel_params(layout, dtype, k, t2 or k, t3)
    return {"layout": layout, "t1": t1, "t2": t2, "t3": t3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("order", ["C", "F"])
def test_tsm2_matches_numpy(cp, rng, dtype, k, order):
    m, n = 1531, 1000 + 37          # m != n; n not a multiple of any t1 or of 32 * V
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    A = cp.asarray(A_h, order=order)
    B = cp.asarray(B_h)
    layout = "row" if order == "C" else "col"
    t2 = _params(layout, dtype, k, 64)["t2"]
    fits = rules.t1_candidates(layout, dtype, t2)
    for t1 in sorted({fits[0], max(t for t in fits if t <= 256)}):
        C = _run(cp, A, B, _params(layout, dtype, k, t1))
        _check(C, A_h, B_h, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_tsm2_several_passes_and_t3(cp, rng, dtype, order):
    """t2 < k (A read ceil(k / t2) times, last pass partial) and every t3 the kernels take."""
    m, n, k = 777, 2049, 21
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    A, B = cp.asarray(A_h, order=order), cp.asarray(B_h)
    layout = "row" if order == "C" else "col"
    for t2 in (4, 8):
        for t3 in ((1, 2, 3, 8) if layout == "row" else (1, 2, 4, 16)):
            params = {"layout": layout, "t1": 128, "t2": t2, "t3": t3}
            _check(_run(cp, A, B, params), A_h, B_h, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_kernel_lane_groups(cp, rng, dtype):
    """Every lane-group count G of the row kernel (t2 not a multiple of G, partial last pass,
    n not a multiple of the step, split over n) against NumPy, into NaN-poisoned outputs."""
    m, n, k = 517, 4099, 19
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    A, B = cp.asarray(A_h), cp.asarray(B_h)
    item = np.dtype(dtype).itemsize
    C = cp.empty((m, k), dtype=dtype)
    # (t2, t3, groups, steps per B tile; None: the rule's, depth)
    for t2, t3, g, u, d in ((19, 1, 1, None, 1), (19, 3, 2, None, 1), (19, 4, 4, 1, 1),
                            (10, 4, 4, None, 1), (3, 3, 2, 3, 1), (3, 1, 4, None, 1),
                            (19, 3, 2, 2, 2), (10, 4, 4, 4, 4), (3, 2, 4, 2, 2)):
        assert t3 * -(-t2 // g) <= rules.MAX_ROW_ACC[item]
        for t1 in (64, 512):
            C.fill(cp.nan)
            launch.launch(A, "row", n, B, C, t1, t2, t3, groups=g, steps=u, depth=d)
            _check(C, A_h, B_h, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", (8, 16, 33, 64))
def test_row_kernel_depths(cp, rng, dtype, k):
    """Row kernel with several warp steps of A in flight (lane groups sharing loads by shuffles):
    every depth > 1 the timing tries (none below k = 9: one lane group) and forced groups (SH = G,
    SH = 2 < G, SH = 1 with depth 2), against NumPy on fresh data; m != n, n not a multiple of a
    step or tile, split over n, NaN-poisoned output. Depth 1 is the kernel the other tests run."""
    m, n = 1531, 5133
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    A, B = cp.asarray(A_h), cp.asarray(B_h)
    item = np.dtype(dtype).itemsize
    C = cp.empty((m, k), dtype=dtype)
    t2 = rules.balance_t2(k, k, "row", item)
    runs = []
    for t3 in (2, 4, 8):
        g = rules.row_groups(t2, t3, item)
        if t3 * -(-t2 // g) > rules.MAX_ROW_ACC[item]:
            continue
        u = rules.row_steps(t2, g, 16 // item, item)
        runs += [(t3, g, u, d) for d in rules.row_depths(t3, g, u) if d > 1]
    runs += [(4, 4, 4, 4), (2, 4, 2, 2), (6, 4, 2, 2), (3, 2, 2, 2)]   # (t3, groups, steps, depth)
    for t3, g, u, d in runs:
        for t1 in (64, 384, 512):
            C.fill(cp.nan)
            launch.launch(A, "row", n, B, C, t1, t2, t3, groups=g, steps=u, depth=d)
            _check(C, A_h, B_h, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tsm2_views_with_unit_stride(cp, rng, dtype):
    """Row slices, column sub-blocks (unaligned rows: scalar loads) and F-ordered sub-blocks."""
    base_h = _random(rng, (1200, 1500), dtype)
    base = cp.asarray(base_h)
    base_f = cp.asfortranarray(base)
    B_h = _random(rng, (700, 5), dtype)
    B = cp.asarray(B_h)
    views = [
        (base[::2, 3:703], base_h[::2, 3:703], "row"),     # lda = 3000, pointer not 16-byte aligned
        (base[5:905, 100:800], base_h[5:905, 100:800], "row"),
        (base_f[7:1007, 1:701], base_h[7:1007, 1:701], "col"),
    ]
    for A, A_h, layout in views:
        assert not (A.flags.c_contiguous or A.flags.f_contiguous)
        assert rules.layout_of(A)[0] == layout
        _check(_run(cp, A, B, _params(layout, dtype, 5, 128)), A_h, B_h, dtype)


def test_tsm2_rejects_views_without_unit_stride(cp, rng):
    A = cp.asarray(_random(rng, (300, 400), np.float64))[:, ::2]
    with pytest.raises(ValueError, match="unit stride"):
        get("tsgemm.tsm2").prepare(A, _params("row", np.float64, 4, 128))
    B = cp.asarray(_random(rng, (200, 4), np.float64))
    p = planner.plan(A, B)
    assert p.kernel != "tsgemm.tsm2"
    rejected = [c for c in p.candidates if c.kernel == "tsgemm.tsm2"]
    assert rejected and "non-contiguous" in rejected[0].why
    np.testing.assert_allclose(p.run(A, B).get(), A.get() @ B.get(), rtol=1e-12)


def test_tsm2_rejects_a_plan_for_the_other_layout(cp, rng):
    A = cp.asfortranarray(cp.asarray(_random(rng, (300, 400), np.float32)))
    with pytest.raises(ValueError, match="row-major"):
        get("tsgemm.tsm2").prepare(A, _params("row", np.float32, 4, 128))


@pytest.mark.parametrize("order", ["C", "F"])
def test_tsm2_vector_strided_b_and_strided_out(cp, rng, order):
    m, n = 999, 1234
    A_h = _random(rng, (m, n), np.float64)
    A = cp.asarray(A_h, order=order)
    layout = "row" if order == "C" else "col"
    x_h = _random(rng, n, np.float64)
    _check(_run(cp, A, cp.asarray(x_h), _params(layout, np.float64, 1, 256)), A_h, x_h, np.float64)
    Bw_h = _random(rng, (n, 12), np.float64)
    Bv = cp.asarray(Bw_h)[:, ::3]                       # no unit column stride: copied (it is small)
    out_big = cp.full((m, 8), cp.nan)
    out = out_big[:, ::2]                                # strided output
    k = get("tsgemm.tsm2")
    C = k.run(k.prepare(A, _params(layout, np.float64, 4, 128)), Bv, out=out)
    _check(C, A_h, Bw_h[:, ::3], np.float64)
    assert cp.isnan(out_big[:, 1::2]).all(), "wrote outside the output view"


def test_tsm2_is_deterministic(cp, rng):
    A = cp.asarray(_random(rng, (2000, 3000), np.float32))
    B = cp.asarray(_random(rng, (3000, 16), np.float32))
    p = _params("row", np.float32, 16, 256)
    assert cp.array_equal(_run(cp, A, B, p), _run(cp, A, B, p))


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_planner_tsgemm_on_gpu(cp, rng, order, dtype):
    """The planner measures TSM2's configs (and cuBLAS), keeps the fastest (the cache holds every
    config's timing, the plan's is the least), explains the choice and runs correctly."""
    m, n, k = 4096, 3000, 8
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    A, B = cp.asarray(A_h, order=order), cp.asarray(B_h)
    p = planner.plan(A, B)
    cands = {c.kernel: c for c in p.candidates}
    assert {"tsgemm.tsm2", "gemm.cublas"} <= set(cands)
    tc = cands["tsgemm.tsm2"]
    assert tc.params["layout"] == ("row" if order == "C" else "col")
    assert tc.source == cands["gemm.cublas"].source == "measured"
    assert "t2threshold" in tc.why and "fastest of" in tc.why
    bucket = mc.canonical(["bucket", list(rules.bucket(dtype, tc.params["layout"], m, n, k))])
    timed = {TSM2Config.of(e.key.config.params()): e.seconds for e in mc.cache().entries("tsgemm.tsm2")
             if e.key.problem == bucket and e.key.config.params()["t2"] == tc.params["t2"]}
    assert len(timed) >= 2 and TSM2Config.of(tc.params) == min(timed, key=timed.get)
    _check(p.run(A, B), A_h, B_h, dtype)
    # forced TSM2 through the planner too
    q = planner.plan(A, B, kernels=["tsgemm.tsm2"])
    out = cp.full((m, k), cp.nan, dtype=dtype)
    _check(q.bind(A)(B, out=out), A_h, B_h, dtype)


def test_empty_and_tiny(cp, rng):
    kern = get("tsgemm.tsm2")
    A = cp.asarray(_random(rng, (5, 0), np.float64))
    C = kern.run(kern.prepare(A, _params("row", np.float64, 3, 64)), cp.zeros((0, 3)))
    assert C.shape == (5, 3) and not C.any()
    A_h = _random(rng, (1, 7), np.float64)
    B_h = _random(rng, (7, 2), np.float64)
    C = _run(cp, cp.asarray(A_h), cp.asarray(B_h), _params("row", np.float64, 2, 64))
    _check(C, A_h, B_h, np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(rules.ASYNC_VARIANTS))
@pytest.mark.parametrize("k", [1, 4, 9, 16, 32, 33])
@pytest.mark.parametrize("order", ["C", "F"])
def test_async_variant_through_the_kernel_interface(cp, rng, dtype, variant, k, order):
    """Params carrying the cp.async kernel (what the planner's measurement keeps when it wins) run
    through TSM2.prepare/run, row-major (C order) and column-major (F order) A: NaN-poisoned
    output, m and n off every tile, vector B too."""
    m, n = 1532, 1000 + 36                     # m, n * itemsize multiples of 16 (the kernel's need)
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    A, B = cp.asarray(A_h, order=order), cp.asarray(B_h)
    layout = "row" if order == "C" else "col"
    params = dict(_params(layout, dtype, 16, 256), **{"async": variant})
    if layout == "row":
        params["depth"] = 1
    _check(_run(cp, A, B, params), A_h, B_h, dtype)
    C = _run(cp, A, B[:, 0], params)
    _check(C[:, None], A_h, B_h[:, :1], dtype)


def test_async_params_refuse_misaligned_a(cp, rng):
    """A plan whose measurement chose the cp.async kernel refuses, naming A, an A whose rows
    (row-major) or columns (column-major) do not start on 16-byte boundaries (a slice), instead
    of reading it wrong."""
    A = cp.asarray(_random(rng, (300, 1001), np.float32))[:, :999]
    params = dict(_params("row", np.float32, 16, 256), depth=1, **{"async": "preset"})
    with pytest.raises(ValueError, match="A: .*16-byte"):
        get("tsgemm.tsm2").prepare(A, params)
    A = cp.asfortranarray(cp.asarray(_random(rng, (1001, 300), np.float32)))[:999, :]
    params = dict(_params("col", np.float32, 16, 256), **{"async": "preset"})
    with pytest.raises(ValueError, match="A: .*column-major.*16-byte"):
        get("tsgemm.tsm2").prepare(A, params)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_planner_k16_matches_numpy(cp, rng, dtype, order):
    """The planner's TSM2 choice at k = 16 (the measurement also tries the cp.async kernel, for
    both layouts) gives NumPy's product, whichever kernel won."""
    m, n, k = 20000, 4096, 16
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, k), dtype)
    A, B = cp.asarray(A_h, order=order), cp.asarray(B_h)
    plan = planner.plan(A, B, kernels=["tsgemm.tsm2"])
    assert plan.kernel == "tsgemm.tsm2"
    assert rules.async_eligible("row" if order == "C" else "col", dtype, k, m, n)
    _check(plan.run(A, B), A_h, B_h, dtype)


def test_device_attribute_matches_cupy(cp):
    """The cached single-attribute reads (_cuda.device_attribute) agree with CuPy's full query."""
    from matplan.kernels import _cuda
    dev = cp.cuda.Device().id
    attrs = cp.cuda.Device(dev).attributes
    for name in _cuda._ATTRIBUTE_ENUMS:
        assert _cuda.device_attribute(name, dev) == attrs[name]


@pytest.mark.parametrize("async_variant", [None, "preset"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_prepared_launches_follow_k_and_strides(cp, rng, dtype, async_variant, order):
    """TSM2 keeps one launch per (shapes, k, strides, alignment, params) and reuses it across
    prepared inputs (plan.run prepares A on every call): runs with another k, a strided out, a B
    view at an odd offset and a split (few rows, long n) all match NumPy, every out element is
    written (NaN-poisoned), and a second A of the same shape reuses the first one's launches."""
    k = get("tsgemm.tsm2")
    m, n = 300, 4096                                   # few rows, long n: a split over n
    A_h = _random(rng, (m, n), dtype)
    A = cp.asarray(A_h, order=order)
    layout = "row" if order == "C" else "col"
    params = dict(_params(layout, dtype, 16, 128))   # t1 = 256: column-major float64's B tile is too big
    if layout == "row":
        params["depth"] = 1
    if async_variant:
        params["async"] = async_variant
    tsm2._LAUNCHES.clear()
    for A_h in (A_h, _random(rng, (m, n), dtype)):   # the second A: no new launches
        A = cp.asarray(A_h, order=order)
        prep = k.prepare(A, params)
        for kk, out_order, offset in ((16, "C", 0), (16, "C", 0), (9, "C", 0), (16, "F", 0), (16, "C", 1)):
            B_h = _random(rng, (n, kk + offset), dtype)
            B = cp.asarray(B_h)[:, offset:]                # offset 1: B's rows not 16-byte aligned
            out = cp.full((m, kk), cp.nan, dtype=dtype, order=out_order)
            assert k.run(prep, B, out=out) is out
            _check(out, A_h, B_h[:, offset:], dtype)
        # (16, C) reused; the async path copies the offset B to a contiguous one, whose key is the first
        assert len(tsm2._LAUNCHES) == (3 if async_variant else 4)
        # run keeps a launch per B / out layout it launched on as they are (the repeated (16, C)
        # call took it); the async path's copied offset B is not kept
        assert len(prep.meta["kept"]) == (3 if async_variant else 4)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_split_finish_in_the_launch(cp, rng, monkeypatch, keep, dtype, order):
    """A split over n sums its slices in the same launch (the row tile's last block): one Launch
    called again and again on fresh B (its tickets must be back at zero after each), on a second
    stream, into F-ordered and strided outputs, with the workspace kept per stream or (``keep``
    False: KEEP_SCRATCH_BYTES 0) allocated each call; NaN-poisoned outputs against NumPy, and a
    repeated call gives the same bits (the slices summed in one order)."""
    monkeypatch.setattr(launch, "KEEP_SCRATCH_BYTES", (4 << 20) if keep else 0)
    launch._SCRATCH.clear()
    m, n, k = 333, 6151, 5                              # few rows, long n; m not a multiple of a tile
    A_h = _random(rng, (m, n), dtype)
    A = cp.asarray(A_h, order=order)
    layout, lda = rules.layout_of(A)
    p = _params(layout, dtype, k, 128)
    for S in (2, 3, 7):
        go = launch.Launch(A, layout, lda, k, (k * A.itemsize, A.itemsize), p["t1"], p["t2"], p["t3"], slices=S)
        assert go.S > 1 and go.grid[1] == go.S
        for stream in (cp.cuda.Stream.null, cp.cuda.Stream(non_blocking=True), cp.cuda.Stream.null):
            with stream:
                for _ in range(3):
                    B_h = _random(rng, (n, k), dtype)
                    C = cp.full((m, k), cp.nan, dtype=dtype)
                    go(A, cp.asarray(B_h), C)
                    _check(C, A_h, B_h, dtype)
                C2 = cp.full((m, k), cp.nan, dtype=dtype)
                go(A, cp.asarray(B_h), C2)
                assert bool(cp.array_equal(C, C2))
                stream.synchronize()
        kept = [key for key, _ in launch._SCRATCH.items() if key[:4] == go.scratch_key]
        assert len(kept) == (2 if keep else 0)                 # one set a stream
        # an F-ordered C and a strided view of a wider one (C's own strides in the finish)
        for out in (cp.full((m, k), cp.nan, dtype=dtype, order="F"),
                    cp.full((m, 2 * k + 1), cp.nan, dtype=dtype)[:, 1:2 * k + 1:2]):
            go_out = launch.Launch(A, layout, lda, k, out.strides, p["t1"], p["t2"], p["t3"], slices=S)
            B_h = _random(rng, (n, k), dtype)
            go_out(A, cp.asarray(B_h), out)
            _check(out, A_h, B_h, dtype)


def _poison_pool(cp, shape, dtype, blocks=4):
    """Free NaN-filled blocks of ``shape`` into CuPy's pool, so an output allocated next holds NaN
    wherever a kernel does not write it."""
    blocks = [cp.full(shape, cp.nan, dtype=dtype) for _ in range(blocks)]
    del blocks


@pytest.mark.parametrize("async_variant", [None, "preset"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_plan_run_keeps_a_launch_per_operand_layout(cp, rng, monkeypatch, async_variant, order):
    """plan.run goes through TSM2's runner: the first call for an A layout and alignment and a B
    shape and strides prepares and runs, later ones launch the kept launch. Repeated calls, a B
    view of another k with the same strides, a B at an odd offset, out= given (twice), and A in the
    other layout (the plan's ValueError, naming A) each give NumPy's product in a NaN-poisoned
    output."""
    dtype = np.float32
    m, n, k = 300, 4096, 16
    A_h, W_h = _random(rng, (m, n), dtype), _random(rng, (n, k + 1), dtype)
    A, W = cp.asarray(A_h, order=order), cp.asarray(W_h)
    B = cp.ascontiguousarray(W[:, :k])
    plan = planner.plan(A, B, kernels=["tsgemm.tsm2"], measure="never")
    if async_variant:
        plan = dataclasses.replace(plan, params={**plan.params, "async": async_variant})
    kern, prepared = get("tsgemm.tsm2"), []
    monkeypatch.setattr(kern, "prepare", lambda A, p: prepared.append(1) or type(kern).prepare(kern, A, p))
    for B_call, B_ref in ((B, W_h[:, :k]), (B, W_h[:, :k]), (W[:, :8], W_h[:, :8]), (W[:, 1:], W_h[:, 1:]), (B, W_h[:, :k])):
        _poison_pool(cp, (m, B_ref.shape[1]), dtype)
        _check(plan.run(A, B_call), A_h, B_ref, dtype)
    assert len(prepared) == 3   # B, the k = 8 view, the odd offset; the repeats launch the kept ones
    for _ in range(2):
        out = cp.full((m, k), cp.nan, dtype=dtype)
        assert plan.run(A, B, out=out) is out
        _check(out, A_h, W_h[:, :k], dtype)
    assert len(prepared) == 4   # out's layout is part of the key: its first call prepared, the second not
    other = cp.asfortranarray(A) if order == "C" else cp.ascontiguousarray(A)
    with pytest.raises(ValueError, match="A: this plan's TSM2 kernel is for"):
        plan.run(other, B)


@pytest.mark.parametrize("async_variant", [None, "preset"])
def test_kept_launch_hands_out_a_spare_c_once(cp, rng, monkeypatch, async_variant):
    """A kept launch's call returns a C that an earlier call of that shape allocated after its
    launch (the spare), NaN-poisoned here: every element written. Each call's C is its own
    (earlier results intact), another stream gets a spare of its own, and the spares are
    SPARE_CACHE_SIZE at most."""
    tsm2._SPARES.clear()
    dtype = np.float64
    m, n, kk = 300, 1024, 8
    A_h, B_h = _random(rng, (m, n), dtype), _random(rng, (n, kk), dtype)
    A, B = cp.asarray(A_h), cp.asarray(B_h)
    kern = get("tsgemm.tsm2")
    params = dict(_params("row", dtype, kk, 128), **({"async": async_variant} if async_variant else {}))
    prep = kern.prepare(A, params)
    results = [kern.run(prep, B), kern.run(prep, B)]   # the first prepares the launch; the second keeps a spare
    assert len(tsm2._SPARES) == 1
    (S,) = tsm2._SPARES.values()
    S.fill(cp.nan)
    results.append(kern.run(prep, B))
    assert results[-1] is S and len(tsm2._SPARES) == 1 and next(iter(tsm2._SPARES.values())) is not S
    with cp.cuda.Stream():
        results.append(kern.run(prep, B))
        results.append(kern.run(prep, B))
    assert len(tsm2._SPARES) == 2                        # one per stream
    assert len({C.data.ptr for C in results}) == len(results)
    for C in results:
        _check(C, A_h, B_h, dtype)
    for rows in range(1, tsm2.SPARE_CACHE_SIZE + 2):     # other shapes: the cache stays bounded
        Ar = A[:rows]
        pr = kern.prepare(Ar, params)
        kern.run(pr, B)
        _check(kern.run(pr, B), A_h[:rows], B_h, dtype)
        assert len(tsm2._SPARES) <= tsm2.SPARE_CACHE_SIZE


@pytest.mark.parametrize("order", ["C", "F"])
def test_cublas_plan_runs_cupy_matmul(cp, rng, order):
    """A cuBLAS plan's run is cupy.matmul's product, with out= too (copied into it)."""
    dtype = np.float64
    A_h, B_h = _random(rng, (500, 700), dtype), _random(rng, (700, 5), dtype)
    A, B = cp.asarray(A_h, order=order), cp.asarray(B_h)
    plan = planner.plan(A, B, kernels=["gemm.cublas"], measure="never")
    _check(plan.run(A, B), A_h, B_h, dtype)
    out = cp.full((500, 5), cp.nan, dtype=dtype)
    assert plan.run(A, B, out=out) is out
    _check(out, A_h, B_h, dtype)
