"""TSM2 on the host: layouts, parameter adaptation, the search space and its configs, pure
candidates and costs, shape buckets, launch plumbing."""
import ast
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from matplan.kernels import get
from matplan.kernels.tsgemm import configs, launch, rules, tsm2, tsm2_async, tsm2_tc
from matplan.kernels.tsgemm.configs import TSM2Config
from matplan.core import device as device_mod
from matplan.core.features import Features
from matplan.models.tsgemm import COL_COLUMN_S, LAUNCH_S
from matplan.tuning_db import refit

H100 = device_mod.known("H100")


def _features(layout="C", dtype="float32", m=16384, n=16384, k=16, dev=H100):
    return Features(op="tsgemm", dtype=dtype, backend="gpu", m=m, n=n, k=k, layout=layout,
                    t2threshold=dev.t2threshold(dtype))


def test_layout_of_contiguous_and_views():
    A = np.zeros((40, 30))
    assert rules.layout_of(A) == ("row", 30)
    assert rules.layout_of(np.asfortranarray(A)) == ("col", 40)
    assert rules.layout_of(A[::2, 3:20]) == ("row", 60)
    assert rules.layout_of(np.asfortranarray(A)[1:30, ::3]) == ("col", 120)
    assert rules.layout_of(A[:, 4:5]) == ("row", 30)          # one column: its stride does not matter
    assert rules.layout_of(A[7:8, ::2])[0] == "col"           # one row with stride 2: a column-major 1 x n
    with pytest.raises(ValueError, match="unit stride"):
        rules.layout_of(A[::2, ::2])


@pytest.mark.parametrize("k,t2,layout,item,want", [
    (16, 16, "row", 4, 16), (33, 64, "col", 4, 17), (33, 16, "row", 8, 11), (64, 64, "col", 8, 16),
    (5, 2, "col", 4, 2), (3, 100, "row", 4, 3), (1, 0, "row", 8, 1)])
def test_balance_t2_even_passes_within_register_budget(k, t2, layout, item, want):
    got = rules.balance_t2(t2, k, layout, item)
    assert got == want
    assert got <= rules.MAX_T2[layout][item]
    assert math.ceil(k / got) == math.ceil(k / min(max(t2, 1), k, rules.MAX_T2[layout][item]))


def test_row_rows_per_warp_adapter():
    # t3 elements in flight -> 16-byte loads per lane; enough rows per shared-memory B read
    assert rules.row_rows_per_warp(1, 8, 4) == 2
    assert rules.row_rows_per_warp(16, 1, 4) == 2           # t2 / ROW_SMEM_COLUMNS rows per B read
    assert rules.row_rows_per_warp(64, 16, 4) == 4          # register budget: 64 accumulators, 4 groups
    assert rules.row_rows_per_warp(8, 16, 8) == 8
    assert rules.row_rows_per_warp(32, 16, 8) == 4
    # lane groups: the fewest keeping t3 x ceil(t2 / G) accumulators within the target
    assert rules.row_groups(1, 8, 4) == 1 and rules.row_groups(16, 2, 4) == 1
    assert rules.row_groups(16, 4, 4) == 2 and rules.row_groups(16, 8, 4) == 4
    assert rules.row_groups(16, 4, 8) == 2 and rules.row_groups(32, 8, 4) == 4
    assert rules.col_t3(3) == 4 and rules.col_t3(1) == 1 and rules.col_t3(40) == 16


def test_t3_candidates_are_the_models_and_larger():
    assert rules.t3_candidates("col", "float32", 8, 2) == [2, 4, 8]
    assert rules.t3_candidates("col", "float64", 8, 16) == [16]
    assert rules.t3_candidates("row", "float32", 16, 1) == [1, 2, 4]        # 64 accumulators at most
    assert rules.t3_candidates("row", "float64", 1, 2) == [2, 4, 8]
    assert rules.t3_candidates("row", "float32", 1, 4) == [4, 8]
    for t3 in rules.t3_candidates("col", "float32", 4, 3):
        assert all(t1 % t3 == 0 for t1 in rules.T1_CHOICES)


def test_t1_candidates_fit_shared_memory():
    assert rules.t1_candidates("col", "float64", 16) == [64, 128]      # two 256 x 16 x 8 B tiles would not fit
    assert rules.t1_candidates("col", "float32", 16, [64, 256, 1024]) == [64, 256]
    assert rules.t1_candidates("row", "float64", 32) == list(rules.T1_CHOICES)
    for t1 in rules.t1_candidates("col", "float32", 32):
        assert 2 * t1 * 32 * 4 <= rules.SMEM_LIMIT


def test_kernel_names():
    assert launch.kernel_name("col", np.float64, 128, 8, 4, 2) == "tsm2_colmajor<double,128,8,4,2>"
    assert launch.kernel_name("row", np.float32, 256, 16, 2, 4, 2, 3) == "tsm2_rowmajor<float,256,16,2,4,2,3,1>"
    assert launch.kernel_name("row", np.float32, 512, 16, 4, 4, 2, 4, 2) == "tsm2_rowmajor<float,512,16,4,4,2,4,2>"
    assert rules.row_steps(16, 2, 4, 4) == 4 and rules.row_steps(32, 1, 4, 4) == 1   # 48 KiB of shared memory


@pytest.mark.parametrize("layout,kl", [("C", "row"), ("F", "col")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [1, 2, 3, 8, 16, 33, 64])
def test_candidates_and_cost_without_gpu(layout, kl, dtype, k):
    kern = get("tsgemm.tsm2")
    f = _features(layout, dtype, k=k)
    assert kern.supports(f) is None
    (p,) = list(kern.candidates(f, H100))
    assert p["layout"] == kl and p["t1"] in rules.T1_CHOICES
    assert 1 <= p["t2"] <= k and p["t3"] >= 1
    assert p == configs.default(H100, f).params() and p in kern.search_space(f, H100)   # the model's, untimed
    assert rules.t1_fits(kl, p["t1"], p["t2"], np.dtype(dtype).itemsize)
    c = kern.cost(f, p, H100)
    assert 0 < c.run_s < 1 and c.prepare_s == 0
    assert f"k={k}" in c.why and "t2threshold" in c.why and "utilisation" in c.why
    # never faster than moving A once at the device's bandwidth
    assert c.run_s >= 16384 * 16384 * np.dtype(dtype).itemsize / H100.mem_bandwidth


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_column_kernel_on_few_rows_is_bound_by_its_walk_over_n(dtype):
    """Too few rows to fill the GPU (one block at m = 256, no split): the column kernel's cost is
    its threads' walk over n's columns; with rows enough the bytes bound it and the walk is not
    named; the row kernel never takes the term."""
    kern = get("tsgemm.tsm2")
    small = _features("F", dtype, m=256, n=256, k=8)
    (p,) = list(kern.candidates(small, H100))
    c = kern.cost(small, p, H100)
    assert launch.column_walk(256, 256, np.dtype(dtype).itemsize, p["t1"], p["t2"], p["t3"], H100.sms) == 256
    assert c.run_s == pytest.approx(256 * COL_COLUMN_S + LAUNCH_S)   # one slice: every thread walks all 256
    assert "walk over their 256 columns" in c.why
    big = _features("F", dtype, m=16384, n=16384, k=8)
    (p,) = list(kern.candidates(big, H100))
    c = kern.cost(big, p, H100)
    assert "walk" not in c.why
    assert c.run_s > launch.column_walk(16384, 16384, np.dtype(dtype).itemsize, p["t1"], p["t2"], p["t3"],
                                        H100.sms) * COL_COLUMN_S + LAUNCH_S
    with refit.installed({"tsgemm.COL_COLUMN_S": 0.0}):    # a report's fold without the column kernel
        assert "walk" not in kern.cost(small, list(kern.candidates(small, H100))[0], H100).why
    row = _features("C", dtype, m=256, n=256, k=8)
    (p,) = list(kern.candidates(row, H100))
    assert "walk" not in kern.cost(row, p, H100).why


def test_strided_layout_is_not_planned():
    reason = get("tsgemm.tsm2").supports(_features("strided"))
    assert reason and "non-contiguous" in reason


def test_old_gpus_plan_too():
    k40 = device_mod.known("K40c")
    (p,) = list(get("tsgemm.tsm2").candidates(_features("F", "float64", k=8, dev=k40), k40))
    assert p["layout"] == "col"


def test_shape_buckets():
    """The measurement's key of a tall-and-skinny product: dtype, layout and the power-of-two
    buckets of k, n and the rows (capped at BUCKET_ELEMENTS / n: every m past it shares one)."""
    key = rules.bucket(np.float32, "row", 9000, 9000, 5)
    assert key == ("float32", "row", 8, 16384, 16384)
    assert rules.bucket("float32", "row", 12000, 16384, 8) == key
    assert rules.timed_rows(32768, 32768) == 8192
    assert rules.bucket("float32", "row", 32768, 32768, 8)[-1] == rules.bucket_rows(32768, 32768) == 32768
    assert rules.bucket("float32", "row", 1 << 20, 32768, 8) == rules.bucket("float32", "row", 40000, 32768, 8)
    assert rules.bucket("float32", "row", 9000, 32768, 8) != rules.bucket("float32", "row", 32768, 32768, 8)
    assert rules.bucket("float32", "row", 8192, 8192, 8) != rules.bucket("float32", "row", 1 << 20, 8192, 8)
    f = _features("F", "float64", m=5000, n=3000, k=3)
    assert get("tsgemm.tsm2").measure_key(f) == get("gemm.cublas").measure_key(f) == ("float64", "col", 4, 4096, 8192)
    assert get("tsgemm.tsm2").measure_key(_features("strided")) is None
    assert get("gemm.cublas").measure_key(Features(op="gemm", dtype="float64", backend="gpu", m=64, n=64, k=64,
                                                   layout="C")) is None


def test_cost_is_a_function_of_the_features_and_the_device(monkeypatch):
    """candidates(), search_space(), measure_key() and cost() of both tall-and-skinny kernels never
    touch the GPU (CuPy is not even asked for) and give the same answer every time: the planner's
    measurement, not the kernel, times and calibrates."""
    def no_gpu():
        raise AssertionError("a planning call asked for CuPy")
    for mod in (tsm2, tsm2_async, tsm2_tc, launch):
        monkeypatch.setattr(mod, "cupy_module", no_gpu)
    tsm, cub = get("tsgemm.tsm2"), get("gemm.cublas")
    for layout in ("C", "F"):
        for dtype in ("float32", "float64"):
            for k in (1, 4, 16, 32):
                f = _features(layout, dtype, k=k)
                space = tsm.search_space(f, H100)
                assert list(tsm.candidates(f, H100))[0] in space and tsm.measure_key(f) == cub.measure_key(f)
                for p in space:
                    a, b = tsm.cost(f, p, H100), tsm.cost(f, dict(p), H100)
                    assert a == b and not a.calibrated and 0 < a.run_s < 1
                c = cub.cost(f, {}, H100)
                assert c == cub.cost(f, {}, H100) and not c.calibrated and "measured/model" not in c.why


def test_split_count_fills_the_gpu_without_tiny_slices():
    assert launch.split_count("row", 1 << 20, 8192, 256, 2, 4, 132) == 1      # enough warps already
    s = launch.split_count("col", 16384, 16384, 128, 4, 4, 132)              # 4096 threads: split
    assert 8 <= s <= launch.MAX_SPLIT and 16384 // s >= launch.SPLIT_MIN_TILES * 128
    assert launch.split_count("col", 100, 300, 128, 4, 1, 132) == 1          # n too short to split


def test_cublas_tsgemm_cost_is_the_bandwidth_model():
    """cuBLAS's tsgemm cost: A, B and C moved once at its measured fraction of the bandwidth, plus
    a launch; no calibration (the planner measures it beside TSM2's configs)."""
    cub = get("gemm.cublas")
    f = _features("F", "float64", k=8)
    c = cub.cost(f, {}, H100)
    want = (f.m * f.n + f.n * f.k + f.m * f.k) * 8 / (H100.mem_bandwidth * 0.95) + LAUNCH_S
    assert not c.calibrated and math.isclose(c.run_s, want, rel_tol=1e-9)


@pytest.mark.parametrize("dtype,k,t3", [("float64", 16, 2), ("float64", 32, 4), ("float32", 32, 4)])
def test_row_cost_finite_for_large_blocks(dtype, k, t3):
    """t1 = 512 won the H100 timing at k >= 16; the column kernel's register count left no whole
    block there (inf), so the row kernel's cost falls back to the unrounded occupancy."""
    t = rules.model_time(H100, 8192, 8192, k, dtype, "row", 512, k, t3)
    assert math.isfinite(t) and t > 0


def test_row_depths_share_loads_across_lane_groups():
    # SH: the largest of G, 2, 1 dividing t3 and G; depth SH when it divides the steps per B tile
    assert rules.row_share(4, 2) == 2 and rules.row_share(4, 4) == 4 and rules.row_share(2, 4) == 2
    assert rules.row_share(3, 2) == 1 and rules.row_share(8, 1) == 1
    assert rules.row_depths(4, 2, 4) == [1, 2]          # fp32 k = 16: G = 2, 4 steps per tile
    assert rules.row_depths(4, 4, 4) == [1, 4]          # k = 32: G = 4
    assert rules.row_depths(4, 4, 2) == [1]             # 4 does not divide 2 steps
    assert rules.row_depths(4, 1, 4) == [1]             # one group: nothing to share
    assert rules.row_depths(3, 2, 4) == [1]


def test_split_waves_fills_the_last_wave():
    """H100 column kernel at n = 32768: 13 slices of 32 blocks at one block per SM are 3.15 waves
    of 132 (the last one 15 % full); 16 slices are 3.88 waves. Never fewer slices than the plain
    rounding of the asked number to whole tiles gives."""
    assert launch.split_waves(13, 26, 32, 32768, 256, 132) == (16, 2048)
    assert launch.split_waves(7, 14, 128, 32768, 128, 264) == (8, 4096)
    S, L = launch.split_waves(16, 16, 16, 16384, 256, 132)
    assert (S, L) == (16, 1024)
    assert launch.split_waves(1, 1, 128, 32768, 128, 396) == (1, 32768)       # no split: unchanged
    assert launch.split_waves(5, 10, 8, 10000, 128, 0) == (5, 2048)           # occupancy unknown
    for S0 in (2, 3, 7, 13):
        S, L = launch.split_waves(S0, 2 * S0, 40, 30000, 256, 132)
        assert S >= launch.split_waves(S0, S0, 40, 30000, 256, 132)[0]
        assert L % 256 == 0 and (S - 1) * L < 30000 <= S * L


def test_configs_are_hashable_and_round_trip_the_plan_params():
    """A TSM2Config is the plan's params dict, frozen: the row kernel's depth, a cp.async winner's
    knob name and a tensor-core winner's variant survive the round trip; labels name each kind."""
    cases = [({"layout": "row", "t1": 512, "t2": 16, "t3": 4, "depth": 2}, "t1=512,t3=4,depth=2"),
             ({"layout": "col", "t1": 128, "t2": 8, "t3": 2}, "t1=128,t3=2"),
             ({"layout": "row", "t1": 256, "t2": 16, "t3": 4, "depth": 1, "async": "s3"}, "async=s3"),
             ({"layout": "col", "t1": 256, "t2": 32, "t3": 4, "tc": "d1"}, "tc=d1")]
    for params, label in cases:
        c = TSM2Config.of(params)
        assert c.params() == params and c.label() == label and TSM2Config.of(c.params()) == c
        assert hash(c) == hash(TSM2Config.of(dict(params)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.t1 = 64


@pytest.mark.parametrize("layout,kl", [("C", "row"), ("F", "col")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [1, 4, 8, 16, 32])
def test_search_space_is_the_t1_search(layout, kl, dtype, k):
    """The configs the planner's measurement times: every (t1, t3, depth) of the register kernel
    for the model's t2 (t1 from t1_candidates, t3 from t3_candidates, depths from the row rules),
    then the cp.async variants where async_eligible and the 3xTF32 variants where tsm2_tc.eligible
    (float32, k in TC_K, compute capability 8.0 or later), each once."""
    f = _features(layout, dtype, k=k)
    space = [TSM2Config.of(p) for p in get("tsgemm.tsm2").search_space(f, H100)]
    assert len(set(space)) == len(space)
    reg = [c for c in space if not (c.async_variant or c.tc_variant)]
    item = np.dtype(dtype).itemsize
    mp = rules.model_params(H100, f)
    t2, t3 = rules.kernel_params(kl, dtype, k, mp["t2"], mp["t3"])
    t1s, t3s = rules.t1_candidates(kl, dtype, t2, mp["t1"]), rules.t3_candidates(kl, dtype, t2, t3)
    want = {(t1, x, d) for x in t3s for d in rules.depths(kl, item, 16 // item, t2, x) for t1 in t1s}
    assert {(c.t1, c.t3, c.depth) for c in reg} == want and all(c.t2 == t2 and c.layout == kl for c in space)
    asyn = [c.async_variant for c in space if c.async_variant]
    assert asyn == (list(configs.async_variants(dtype, k, kl, f.m, f.n))
                    if rules.async_eligible(kl, dtype, k, f.m, f.n) else [])
    tc = [c.tc_variant for c in space if c.tc_variant]
    assert tc == (list(tsm2_tc.variants(kl)) if dtype == "float32" and 17 <= k <= 64 and tsm2_tc.ENABLED else [])
    old = dataclasses.replace(H100, compute_capability="7.0")   # no TF32 mma
    assert not any(TSM2Config.of(p).tc_variant for p in get("tsgemm.tsm2").search_space(f, old))


def test_row_candidates_carry_a_depth_without_gpu():
    (p,) = list(get("tsgemm.tsm2").candidates(_features("C", "float32", k=16), H100))
    assert p["depth"] == 1                             # untimed: the kernel as it was
    (q,) = list(get("tsgemm.tsm2").candidates(_features("F", "float32", k=16), H100))
    assert "depth" not in q


def test_async_eligibility():
    """The measurement tries the cp.async kernel for k in ASYNC_K (column-major from k = 1) where A's
    rows (row-major) or columns (column-major) start on 16-byte boundaries."""
    assert rules.async_eligible("row", np.float32, 16, 4097, 4096)
    assert not rules.async_eligible("row", np.float32, 16, 4096, 4097)   # rows not 16-byte aligned
    assert rules.async_eligible("col", np.float64, 16, 4096, 4097)
    assert not rules.async_eligible("col", np.float64, 16, 4097, 4096)   # columns not 16-byte aligned
    assert rules.async_eligible("row", np.float64, 3, 4096, 4096)
    assert not rules.async_eligible("row", np.float64, 2, 4096, 4096)    # k below ASYNC_K
    assert rules.async_eligible("col", np.float32, 1, 4096, 4096)         # column-major: from k = 1


def test_async_variants_skip_repeated_configs_and_small_grid_ones_on_capped_timings():
    """The measurement tries each distinct knob set once: ``wr1`` where the preset has two
    warps along the rows (float64 k = 16), not where it has one (float32 k = 16); the variants
    for small grids only where it times all of A's rows (n = 8192, not n = 32768)."""
    assert configs.async_variants(np.float64, 16, "row", 8192, 8192) == ("preset", "s3", "minb1", "wr1")
    assert configs.async_variants(np.float32, 16, "row", 8192, 8192) == ("preset", "s3", "minb1")
    assert configs.async_variants(np.float64, 16, "col", 32768, 32768) == ("preset", "s3")
    for dtype in (np.float32, np.float64):
        for k in (1, 2, 4, 8, 16, 32):
            for layout in ("row", "col"):
                names = configs.async_variants(dtype, k, layout, 8192, 8192)
                assert names[0] == "preset" and set(names) <= set(rules.ASYNC_VARIANTS)
                knobs = [configs.async_config(dtype, k, v, layout) for v in names]
                assert all(a != b for i, a in enumerate(knobs) for b in knobs[i + 1:])


def test_async_presets_take_minb_one_only_where_minb_two_spills():
    """float64 k = 32 (64 accumulators of 8 bytes a thread) takes minb = 1 in its preset, so the
    measurement's ``minb1`` variant repeats it and is not tried there; every other preset keeps
    the default register cap."""
    for dtype in (np.float32, np.float64):
        for k in (4, 8, 16, 32, 64):
            for col in (False, True):
                want = 1 if (dtype is np.float64 and k >= 32) else tsm2_async.DEFAULT_MINB
                assert tsm2_async.default_config(dtype, k, col)["minb"] == want
    assert "minb1" not in configs.async_variants(np.float64, 32, "row", 8192, 8192)
    assert "minb1" in configs.async_variants(np.float32, 32, "row", 8192, 8192)


def test_tc_is_tried_only_when_enabled(monkeypatch):
    """The planner tries tsm2_tc only when enabled (the default), for float32 and k in TC_K with
    aligned rows or columns, on a GPU of compute capability 8.0 or later."""
    assert tsm2_tc.threads("d1") == 256
    monkeypatch.setattr(tsm2_tc, "ENABLED", False)
    assert not tsm2_tc.eligible(np.float32, 32, "col", 4096, 4096)
    monkeypatch.setattr(tsm2_tc, "ENABLED", True)
    assert not tsm2_tc.eligible(np.float64, 32, "col", 4096, 4096)      # float32 only
    assert not tsm2_tc.eligible(np.float32, 16, "col", 4096, 4096)      # k below TC_K
    assert not tsm2_tc.eligible(np.float32, 32, "col", 4097, 4096)      # columns not 16-byte aligned
    assert not tsm2_tc.eligible(np.float32, 32, "row", 4096, 4097)      # rows not 16-byte aligned
    assert not tsm2_tc.eligible(np.float32, 32, "row", 4096, 4096, "7.5")   # no TF32 mma.sync
    assert tsm2_tc.eligible(np.float32, 32, "row", 4096, 4096, "9.0")
    f = _features("C", "float32", k=32)
    monkeypatch.setattr(tsm2_tc, "ENABLED", False)
    assert not any("tc" in p for p in get("tsgemm.tsm2").search_space(f, H100))


def test_tc_names_match_the_cu_instantiations():
    """Every kernel name tsm2_tc compiles (name expressions) is instantiated in tsm2_tc.cu, and every
    instantiation there is one tsm2_tc names: the two lists are kept by hand in two languages."""
    import re
    from matplan.kernels import _cuda
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
    """SplitSum (tsm2_tc.TcLaunch's split-K side): with one slice the kernel
    writes C through C's strides and nothing is summed; with S slices it writes a contiguous
    S x m x k workspace and one ordered sum goes to C through C's strides."""
    from matplan.kernels import _cuda
    launches = []
    monkeypatch.setattr(_cuda, "function", lambda src, name, names, options=(): name)
    monkeypatch.setattr(_cuda, "packed", lambda fn, src, name: lambda grid, block, args: launches.append((fn, grid, args)))
    monkeypatch.setattr(launch, "sms", lambda: 132)
    m, k = 1000, 16
    one = launch.SplitSum(np.float32, m, k, (4, 4 * m), 1)         # an F-ordered C
    assert (one.ldc, one.size, one.mk) == ((1, m), 0, m * k)
    one("ws", "C")
    assert launches == []
    three = launch.SplitSum(np.float64, m, k, (8 * k, 8), 3)
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


FAMILY = Path(rules.__file__).resolve().parent


def test_family_modules_are_small_and_import_at_the_top():
    """kernels/tsgemm: every module at most ~600 lines, every import of a matplan module at module
    top (none hidden in a function to dodge a cycle), and no module imports the planner."""
    for path in sorted(FAMILY.glob("*.py")):
        text = path.read_text()
        assert text.count("\n") <= 600, f"{path.name}: {text.count(chr(10))} lines"
        tree = ast.parse(text)
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            inner = [n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom) and (n.level or "matplan" in (n.module or ""))]
            assert not inner, f"{path.name}:{fn.name} imports inside a function"
        mods = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not any("planner" in m for m in mods), f"{path.name} imports the planner"


def test_family_has_no_import_cycle():
    """The imports among kernels/tsgemm's modules form no cycle (rules < launch < tsm2_async <
    tsm2_tc < configs < tsm2; vendor beside)."""
    edges = {}
    for path in FAMILY.glob("*.py"):
        tree = ast.parse(path.read_text())
        deps = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.level == 1:
                deps |= {n.module} if n.module else {a.name for a in n.names}
        edges[path.stem] = {d.split(".")[0] for d in deps} & {p.stem for p in FAMILY.glob("*.py")}
    state = {}

    def visit(v, trail):
        assert state.get(v) != "open", "import cycle: " + " -> ".join(trail + [v])
        if state.get(v) is None:
            state[v] = "open"
            for w in edges[v]:
                visit(w, trail + [v])
            state[v] = "done"
    for v in edges:
        visit(v, [])
