"""TSM2 kernel module on the host: layouts, parameter adaptation, candidates, costs, the t1 store."""
import math

import numpy as np
import pytest

from matplan.kernels import get
from matplan.kernels.tsgemm import tsm2
from matplan.core import device as device_mod
from matplan.core.features import Features

H100 = device_mod.known("H100")


def _features(layout="C", dtype="float32", m=16384, n=16384, k=16, dev=H100):
    return Features(op="tsgemm", dtype=dtype, backend="gpu", m=m, n=n, k=k, layout=layout,
                    t2threshold=dev.t2threshold(dtype))


def test_layout_of_contiguous_and_views():
    A = np.zeros((40, 30))
    assert tsm2.layout_of(A) == ("row", 30)
    assert tsm2.layout_of(np.asfortranarray(A)) == ("col", 40)
    assert tsm2.layout_of(A[::2, 3:20]) == ("row", 60)
    assert tsm2.layout_of(np.asfortranarray(A)[1:30, ::3]) == ("col", 120)
    assert tsm2.layout_of(A[:, 4:5]) == ("row", 30)          # one column: its stride does not matter
    assert tsm2.layout_of(A[7:8, ::2])[0] == "col"           # one row with stride 2: a column-major 1 x n
    with pytest.raises(ValueError, match="unit stride"):
        tsm2.layout_of(A[::2, ::2])


@pytest.mark.parametrize("k,t2,layout,item,want", [
    (16, 16, "row", 4, 16), (33, 64, "col", 4, 17), (33, 16, "row", 8, 11), (64, 64, "col", 8, 16),
    (5, 2, "col", 4, 2), (3, 100, "row", 4, 3), (1, 0, "row", 8, 1)])
def test_balance_t2_even_passes_within_register_budget(k, t2, layout, item, want):
    got = tsm2.balance_t2(t2, k, layout, item)
    assert got == want
    assert got <= tsm2.MAX_T2[layout][item]
    assert math.ceil(k / got) == math.ceil(k / min(max(t2, 1), k, tsm2.MAX_T2[layout][item]))


def test_row_rows_per_warp_adapter():
    # t3 elements in flight -> 16-byte loads per lane; enough rows per shared-memory B read
    assert tsm2.row_rows_per_warp(1, 8, 4) == 2
    assert tsm2.row_rows_per_warp(16, 1, 4) == 2           # t2 / ROW_SMEM_COLUMNS rows per B read
    assert tsm2.row_rows_per_warp(64, 16, 4) == 4          # register budget: 64 accumulators, 4 groups
    assert tsm2.row_rows_per_warp(8, 16, 8) == 8
    assert tsm2.row_rows_per_warp(32, 16, 8) == 4
    # lane groups: the fewest keeping t3 x ceil(t2 / G) accumulators within the target
    assert tsm2.row_groups(1, 8, 4) == 1 and tsm2.row_groups(16, 2, 4) == 1
    assert tsm2.row_groups(16, 4, 4) == 2 and tsm2.row_groups(16, 8, 4) == 4
    assert tsm2.row_groups(16, 4, 8) == 2 and tsm2.row_groups(32, 8, 4) == 4
    assert tsm2.col_t3(3) == 4 and tsm2.col_t3(1) == 1 and tsm2.col_t3(40) == 16


def test_t3_candidates_are_the_models_and_larger():
    assert tsm2.t3_candidates("col", "float32", 8, 2) == [2, 4, 8]
    assert tsm2.t3_candidates("col", "float64", 8, 16) == [16]
    assert tsm2.t3_candidates("row", "float32", 16, 1) == [1, 2, 4]        # 64 accumulators at most
    assert tsm2.t3_candidates("row", "float64", 1, 2) == [2, 4, 8]
    assert tsm2.t3_candidates("row", "float32", 1, 4) == [4, 8]
    for t3 in tsm2.t3_candidates("col", "float32", 4, 3):
        assert all(t1 % t3 == 0 for t1 in tsm2.T1_CHOICES)


def test_t1_candidates_fit_shared_memory():
    assert tsm2.t1_candidates("col", "float64", 16) == [64, 128]      # two 256 x 16 x 8 B tiles would not fit
    assert tsm2.t1_candidates("col", "float32", 16, [64, 256, 1024]) == [64, 256]
    assert tsm2.t1_candidates("row", "float64", 32) == list(tsm2.T1_CHOICES)
    for t1 in tsm2.t1_candidates("col", "float32", 32):
        assert 2 * t1 * 32 * 4 <= tsm2.SMEM_LIMIT


def test_kernel_names():
    assert tsm2.kernel_name("col", np.float64, 128, 8, 4, 2) == "tsm2_colmajor<double,128,8,4,2>"
    assert tsm2.kernel_name("row", np.float32, 256, 16, 2, 4, 2, 3) == "tsm2_rowmajor<float,256,16,2,4,2,3,1>"
    assert tsm2.kernel_name("row", np.float32, 512, 16, 4, 4, 2, 4, 2) == "tsm2_rowmajor<float,512,16,4,4,2,4,2>"
    assert tsm2.row_steps(16, 2, 4, 4) == 4 and tsm2.row_steps(32, 1, 4, 4) == 1   # 48 KiB of shared memory


@pytest.mark.parametrize("layout,kl", [("C", "row"), ("F", "col")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [1, 2, 3, 8, 16, 33, 64])
def test_candidates_and_cost_without_gpu(layout, kl, dtype, k):
    kern = get("tsgemm.tsm2")
    f = _features(layout, dtype, k=k)
    assert kern.supports(f) is None
    (p,) = list(kern.candidates(f, H100))
    assert p["layout"] == kl and p["t1"] in tsm2.T1_CHOICES
    assert 1 <= p["t2"] <= k and p["t3"] >= 1
    assert "no GPU timing" in p["t1_source"]
    assert tsm2.t1_fits(kl, p["t1"], p["t2"], np.dtype(dtype).itemsize)
    c = kern.cost(f, p, H100)
    assert 0 < c.run_s < 1 and c.prepare_s == 0
    assert f"k={k}" in c.why and "t2threshold" in c.why and "utilisation" in c.why
    # never faster than moving A once at the device's bandwidth
    assert c.run_s >= 16384 * 16384 * np.dtype(dtype).itemsize / H100.mem_bandwidth


def test_strided_layout_is_not_planned():
    reason = get("tsgemm.tsm2").supports(_features("strided"))
    assert reason and "non-contiguous" in reason


def test_old_gpus_plan_too():
    k40 = device_mod.known("K40c")
    (p,) = list(get("tsgemm.tsm2").candidates(_features("F", "float64", k=8, dev=k40), k40))
    assert p["layout"] == "col"


def test_t1_store_and_buckets():
    key = tsm2.t1_key("dev", np.float32, "row", 5, 9000, 9000)
    assert key == ("dev", "float32", "row", 8, 16384, 16384)
    assert tsm2.t1_key("dev", "float32", "row", 8, 16384, 12000) == key
    # the search's rows are capped at TIMING_ELEMENTS / n, the duel's (the key's) at DUEL_ELEMENTS / n:
    # every m past the duel's cap shares one key
    assert tsm2.timed_rows(32768, 32768) == 8192
    assert tsm2.t1_key("dev", "float32", "row", 8, 32768, 32768)[-1] == tsm2.duel_rows(32768, 32768) == 32768
    assert tsm2.t1_key("dev", "float32", "row", 8, 32768, 1 << 20) == tsm2.t1_key("dev", "float32", "row", 8, 32768, 40000)
    assert tsm2.t1_key("dev", "float32", "row", 8, 32768, 9000) != tsm2.t1_key("dev", "float32", "row", 8, 32768, 32768)
    assert tsm2.t1_key("dev", "float32", "row", 8, 8192, 8192) != tsm2.t1_key("dev", "float32", "row", 8, 8192, 1 << 20)
    store = tsm2.InProcessT1Store()
    assert store.get(key) is None and store.ratio(key) is None
    store.put(key, {"t1": 128, "t3": 2}, {(64, 2): 2e-3, (128, 2): 1e-3}, 1.1)
    assert store.get(key) == {"t1": 128, "t3": 2} and store.ratio(key) == 1.1
    assert store.timings[key] == {"t1=64,t3=2": 2e-3, "t1=128,t3=2": 1e-3}
    store.put(key, {"t1": 64, "t3": 4}, {(64, 4): 1e-3}, float("inf"))
    assert store.get(key) == {"t1": 64, "t3": 4} and store.ratio(key) == 1.1   # non-finite ratio not kept
    old = tsm2.T1_STORE
    try:
        with pytest.raises(TypeError, match="store"):
            tsm2.set_t1_store(object())
        tsm2.set_t1_store(store)
        assert tsm2.T1_STORE is store
    finally:
        tsm2.set_t1_store(old)


def test_cost_uses_the_timing_calibration():
    kern = get("tsgemm.tsm2")
    f = _features("C", "float32", k=4)
    (p,) = list(kern.candidates(f, H100))
    base = kern.cost(f, p, H100)
    old = tsm2.T1_STORE
    try:
        store = tsm2.InProcessT1Store()
        store.put(tsm2.t1_key(H100.name, "float32", "row", 4, f.n, f.m), p, {(p["t1"], p["t3"]): 1.0}, 1.5)
        tsm2.set_t1_store(store)
        cal = kern.cost(f, p, H100)
    finally:
        tsm2.set_t1_store(old)
    assert "measured/model = 1.50" in cal.why
    assert math.isclose(cal.run_s - tsm2.LAUNCH_S, 1.5 * (base.run_s - tsm2.LAUNCH_S), rel_tol=1e-9)
    assert cal.calibrated and not base.calibrated


def test_split_count_fills_the_gpu_without_tiny_slices():
    assert tsm2.split_count("row", 1 << 20, 8192, 256, 2, 4, 132) == 1      # enough warps already
    s = tsm2.split_count("col", 16384, 16384, 128, 4, 4, 132)              # 4096 threads: split
    assert 8 <= s <= tsm2.MAX_SPLIT and 16384 // s >= tsm2.SPLIT_MIN_TILES * 128
    assert tsm2.split_count("col", 100, 300, 128, 4, 1, 132) == 1          # n too short to split


def test_cublas_cost_uses_the_vendor_calibration():
    """cuBLAS's tsgemm cost is scaled by the ratio TSM2's online timing measured for it, and marked
    calibrated so the learned model keeps it (without a GPU nothing is timed: uncalibrated)."""
    cub = get("gemm.cublas")
    f = _features("F", "float64", k=8)
    base = cub.cost(f, {}, H100)
    assert not base.calibrated
    key = tsm2.t1_key(H100.name, "float64", "col", 8, f.n, f.m)
    try:
        tsm2.VENDOR_RATIO[key] = 0.8
        cal = cub.cost(f, {}, H100)
    finally:
        tsm2.VENDOR_RATIO.pop(key, None)
    assert cal.calibrated and "measured/model = 0.80" in cal.why
    assert math.isclose(cal.run_s - tsm2.LAUNCH_S, 0.8 * (base.run_s - tsm2.LAUNCH_S), rel_tol=1e-9)


@pytest.mark.parametrize("dtype,k,t3", [("float64", 16, 2), ("float64", 32, 4), ("float32", 32, 4)])
def test_row_cost_finite_for_large_blocks(dtype, k, t3):
    """t1 = 512 won the H100 timing at k >= 16; the column kernel's register count left no whole
    block there (inf), so the row kernel's cost falls back to the unrounded occupancy."""
    t = tsm2.model_time(H100, 8192, 8192, k, dtype, "row", 512, k, t3)
    assert math.isfinite(t) and t > 0


def test_row_depths_share_loads_across_lane_groups():
    # SH: the largest of G, 2, 1 dividing t3 and G; depth SH when it divides the steps per B tile
    assert tsm2.row_share(4, 2) == 2 and tsm2.row_share(4, 4) == 4 and tsm2.row_share(2, 4) == 2
    assert tsm2.row_share(3, 2) == 1 and tsm2.row_share(8, 1) == 1
    assert tsm2.row_depths(4, 2, 4) == [1, 2]          # fp32 k = 16: G = 2, 4 steps per tile
    assert tsm2.row_depths(4, 4, 4) == [1, 4]          # k = 32: G = 4
    assert tsm2.row_depths(4, 4, 2) == [1]             # 4 does not divide 2 steps
    assert tsm2.row_depths(4, 1, 4) == [1]             # one group: nothing to share
    assert tsm2.row_depths(3, 2, 4) == [1]


def test_split_waves_fills_the_last_wave():
    """H100 column kernel at n = 32768: 13 slices of 32 blocks at one block per SM are 3.15 waves
    of 132 (the last one 15 % full); 16 slices are 3.88 waves. Never fewer slices than the plain
    rounding of the asked number to whole tiles gives."""
    assert tsm2.split_waves(13, 26, 32, 32768, 256, 132) == (16, 2048)
    assert tsm2.split_waves(7, 14, 128, 32768, 128, 264) == (8, 4096)
    S, L = tsm2.split_waves(16, 16, 16, 16384, 256, 132)
    assert (S, L) == (16, 1024)
    assert tsm2.split_waves(1, 1, 128, 32768, 128, 396) == (1, 32768)       # no split: unchanged
    assert tsm2.split_waves(5, 10, 8, 10000, 128, 0) == (5, 2048)           # occupancy unknown
    for S0 in (2, 3, 7, 13):
        S, L = tsm2.split_waves(S0, 2 * S0, 40, 30000, 256, 132)
        assert S >= tsm2.split_waves(S0, S0, 40, 30000, 256, 132)[0]
        assert L % 256 == 0 and (S - 1) * L < 30000 <= S * L


def test_t1_store_keeps_the_row_depth():
    store = tsm2.InProcessT1Store()
    key = tsm2.t1_key("dev", "float32", "row", 16, 32768, 32768)
    store.put(key, {"t1": 512, "t3": 4, "depth": 2}, {(512, 4, 1): 2e-3, (512, 4, 2): 1.5e-3}, 1.0)
    assert store.get(key) == {"t1": 512, "t3": 4, "depth": 2}
    assert store.timings[key] == {"t1=512,t3=4,depth=1": 2e-3, "t1=512,t3=4,depth=2": 1.5e-3}


def test_row_candidates_carry_a_depth_without_gpu():
    (p,) = list(get("tsgemm.tsm2").candidates(_features("C", "float32", k=16), H100))
    assert p["depth"] == 1                             # untimed: the kernel as it was
    (q,) = list(get("tsgemm.tsm2").candidates(_features("F", "float32", k=16), H100))
    assert "depth" not in q


def test_score_candidates_names_failures_and_refuses_when_all_fail():
    """The t1 search never hides a failing launch: failures score inf and are warned about; all
    failing is an error."""
    def time_one(c):
        if c == "bad":
            raise ValueError("no such config")
        return {"a": 2.0, "b": 1.0}[c]
    with pytest.warns(RuntimeWarning, match=r"1 of 3 candidates failed .*first bad: ValueError: no such config"):
        got = tsm2.score_candidates(["a", "bad", "b"], time_one, "search x")
    assert got == {"a": 2.0, "bad": float("inf"), "b": 1.0}
    with pytest.raises(RuntimeError, match="search x: 1 of 1 candidates failed"):
        tsm2.score_candidates(["bad"], time_one, "search x")


def test_async_winner_is_stored_and_labelled():
    """The online store keeps a cp.async winner's knob name; timings are labelled per kind."""
    store = tsm2.InProcessT1Store()
    key = ("dev", "float32", "row", 16, 4096)
    store.put(key, {"t1": 256, "t3": 4, "depth": 1, "async": "s3"},
              {(256, 4, 1): 2.0, ("async", "s3"): 1.0}, 0.9)
    assert store.get(key) == {"t1": 256, "t3": 4, "depth": 1, "async": "s3"}
    assert store.timings[key] == {"t1=256,t3=4,depth=1": 2.0, "async=s3": 1.0}
    assert tsm2.async_eligible("row", np.float32, 16, 4097, 4096)
    assert not tsm2.async_eligible("row", np.float32, 16, 4096, 4097)   # rows not 16-byte aligned
    assert tsm2.async_eligible("col", np.float64, 16, 4096, 4097)
    assert not tsm2.async_eligible("col", np.float64, 16, 4097, 4096)   # columns not 16-byte aligned
    assert tsm2.async_eligible("row", np.float64, 3, 4096, 4096)
    assert not tsm2.async_eligible("row", np.float64, 2, 4096, 4096)    # k below ASYNC_K
    assert tsm2.async_eligible("col", np.float32, 1, 4096, 4096)         # column-major: from k = 1


def test_async_variants_skip_repeated_configs_and_small_grid_ones_on_capped_timings():
    """The online timing tries each distinct knob set once: ``wr1`` where the preset has two
    warps along the rows (float64 k = 16), not where it has one (float32 k = 16); the variants
    for small grids only where it times all of A's rows (n = 8192, not n = 32768)."""
    assert tsm2.async_variants(np.float64, 16, "row", 8192, 8192) == ("preset", "s3", "minb1", "wr1")
    assert tsm2.async_variants(np.float32, 16, "row", 8192, 8192) == ("preset", "s3", "minb1")
    assert tsm2.async_variants(np.float64, 16, "col", 32768, 32768) == ("preset", "s3")
    for dtype in (np.float32, np.float64):
        for k in (1, 2, 4, 8, 16, 32):
            for layout in ("row", "col"):
                names = tsm2.async_variants(dtype, k, layout, 8192, 8192)
                assert names[0] == "preset" and set(names) <= set(tsm2.ASYNC_VARIANTS)
                configs = [tsm2._async_config(dtype, k, v, layout) for v in names]
                assert all(a != b for i, a in enumerate(configs) for b in configs[i + 1:])


def test_async_presets_take_minb_one_only_where_minb_two_spills():
    """float64 k = 32 (64 accumulators of 8 bytes a thread) takes minb = 1 in its preset, so the
    online timing's ``minb1`` variant repeats it and is not tried there; every other preset keeps
    the default register cap."""
    from matplan.kernels.tsgemm import tsm2_async
    for dtype in (np.float32, np.float64):
        for k in (4, 8, 16, 32, 64):
            for col in (False, True):
                want = 1 if (dtype is np.float64 and k >= 32) else tsm2_async.DEFAULT_MINB
                assert tsm2_async.default_config(dtype, k, col)["minb"] == want
    assert "minb1" not in tsm2.async_variants(np.float64, 32, "row", 8192, 8192)
    assert "minb1" in tsm2.async_variants(np.float32, 32, "row", 8192, 8192)


def test_tc_winner_is_stored_and_tc_is_opt_in(monkeypatch):
    """The store keeps a tensor-core winner's variant and labels it; the planner tries tsm2_tc only
    when enabled (the default), for float32 and k in TC_K with aligned rows or columns."""
    from matplan.kernels.tsgemm import tsm2_tc
    store = tsm2.InProcessT1Store()
    key = ("dev", "float32", "col", 32, 16384)
    store.put(key, {"t1": 256, "t3": 4, "depth": 1, "tc": "d1"}, {(256, 4): 2.0, ("tc", "d1"): 1.0}, 0.9)
    assert store.get(key) == {"t1": 256, "t3": 4, "depth": 1, "tc": "d1"}
    assert store.timings[key] == {"t1=256,t3=4": 2.0, "tc=d1": 1.0}
    assert tsm2_tc.threads("d1") == 256
    monkeypatch.setattr(tsm2_tc, "ENABLED", False)
    assert not tsm2_tc.eligible(np.float32, 32, "col", 4096, 4096)
    monkeypatch.setattr(tsm2_tc, "ENABLED", True)
    assert not tsm2_tc.eligible(np.float64, 32, "col", 4096, 4096)      # float32 only
    assert not tsm2_tc.eligible(np.float32, 16, "col", 4096, 4096)      # k below TC_K
    assert not tsm2_tc.eligible(np.float32, 32, "col", 4097, 4096)      # columns not 16-byte aligned
    assert not tsm2_tc.eligible(np.float32, 32, "row", 4096, 4097)      # rows not 16-byte aligned


def test_tc_names_match_the_cu_instantiations():
    """Every kernel name tsm2_tc compiles (name expressions) is instantiated in tsm2_tc.cu, and every
    instantiation there is one tsm2_tc names: the two lists are kept by hand in two languages."""
    import re
    from matplan.kernels import _cuda
    from matplan.kernels.tsgemm import tsm2_tc
    text = re.sub(r"//[^\n]*", "", _cuda.source(tsm2_tc.SOURCE))
    body = text[text.index("#define INSTANTIATE_TF32X3_NT"):]
    inst = set()
    for w, rt, mb, d, lo, fl in re.findall(r"INSTANTIATE_TF32X3_NT\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)", body):
        for col in ("false", "true"):
            for nt in ("2", "4"):
                inst.add(f"tsm2_tf32x3<{col},{nt},{w},{rt},{tsm2_tc.KC},{mb},{d},{lo},{fl}>")
    for args in re.findall(r"INSTANTIATE_TF32X3\(((?:true|false), \d+, \d+, \d+, \d+, \d+, \d+, \d+)\)", body):
        col, nt, w, rt, mb, d, lo, fl = args.split(", ")
        inst.add(f"tsm2_tf32x3<{col},{nt},{w},{rt},{tsm2_tc.KC},{mb},{d},{lo},{fl}>")
    inst |= {f"tsm2_tc_b<{c},{nt}>" for c, nt in re.findall(r"void tsm2_tc_b<(true|false), (\d)>\(", body)}
    assert set(tsm2_tc._names()) == inst


def test_split_sum_plumbing(monkeypatch):
    """SplitSum (the split-K side Launch and tsm2_tc.TcLaunch share): with one slice the kernel
    writes C through C's strides and nothing is summed; with S slices it writes a contiguous
    S x m x k workspace and one ordered sum goes to C through C's strides."""
    from matplan.kernels import _cuda
    launches = []
    monkeypatch.setattr(_cuda, "function", lambda src, name, names, options=(): name)
    monkeypatch.setattr(_cuda, "packed", lambda fn, src, name: lambda grid, block, args: launches.append((fn, grid, args)))
    monkeypatch.setattr(tsm2, "_sms", lambda: 132)
    m, k = 1000, 16
    one = tsm2.SplitSum(np.float32, m, k, (4, 4 * m), 1)         # an F-ordered C
    assert (one.ldc, one.size, one.mk) == ((1, m), 0, m * k)
    one("ws", "C")
    assert launches == []
    three = tsm2.SplitSum(np.float64, m, k, (8 * k, 8), 3)
    assert (three.ldc, three.size) == ((k, 1), 3 * m * k)
    three("ws", "C")
    assert launches == [("tsm2_split_sum<double>", (63,), ("ws", 3, m * k, k, "C", k, 1))]


def test_run_keeps_launches_only_for_2d_device_arrays():
    """TSM2.run's kept-launch key (_kept_key): the device, B's shape, dtype, strides and 16-byte
    alignment, out's shape, dtype and strides; None (the checked path every call) for a 1-D B, a
    B or out that is not a CuPy array (stood in for here: no GPU needed)."""
    import types

    class Dev:   # a stand-in for cupy.ndarray: the attributes the key reads
        def __init__(self, shape, strides, ptr, dtype=np.float32):
            self.shape, self.strides, self.ndim = shape, strides, len(shape)
            self.dtype, self.data = np.dtype(dtype), types.SimpleNamespace(ptr=ptr)
    cp = types.SimpleNamespace(ndarray=Dev, cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 3)))
    B = Dev((64, 8), (32, 4), 4096 + 4)
    assert tsm2._kept_key(cp, B, None) == (3, (64, 8), "f", (32, 4), 4, None)
    out = Dev((100, 8), (4, 400), 0)
    assert tsm2._kept_key(cp, B, out)[-1] == ((100, 8), "f", (4, 400))
    assert tsm2._kept_key(cp, Dev((64,), (4,), 0), None) is None           # a vector B
    assert tsm2._kept_key(cp, np.zeros((64, 8), np.float32), None) is None  # not a device array
    assert tsm2._kept_key(cp, B, np.zeros((100, 8), np.float32)) is None


def test_async_config_rules_and_unpadded_stage():
    """check_config names the knob it rejects; a row-major tile of any whole number of 16-byte
    chunks a warp is accepted (the stage is swizzled, not padded), and shape_of's shared memory
    is stages x (R x tj of A + tj x KP of B), unpadded, in both layouts."""
    from matplan.kernels.tsgemm import tsm2_async
    for dtype, v in ((np.float32, 4), (np.float64, 2)):
        item = np.dtype(dtype).itemsize
        cfg = tsm2_async.default_config(dtype, 16)
        for tj in (3 * v, 6 * v, 8 * v):
            tsm2_async.check_config(dict(cfg, wj=1, tj=tj), item)
        with pytest.raises(ValueError, match=r"^config: tj = .* multiple of wj"):
            tsm2_async.check_config(dict(cfg, wj=2, tj=3 * v), item)
        with pytest.raises(ValueError, match="^config: tr"):
            tsm2_async.check_config(dict(cfg, tr=3), item)
        for col in (False, True):
            c = tsm2_async.default_config(dtype, 16, col)
            sh = tsm2_async.shape_of(c, item, col)
            assert sh["smem_bytes"] == max(c["stages"] * (sh["rows"] * c["tj"] + c["tj"] * sh["kp"]),
                                           c["wj"] * sh["rows"] * sh["kp"] if c["wj"] > 1 else 0) * item
