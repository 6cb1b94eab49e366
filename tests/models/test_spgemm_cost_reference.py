"""The cheaper SpGEMM costs give the figures and text of the old ones: spgemm.hash's cost with its
path, groups and nnz(C) taken once (reference copies below: the old describe_groups, hash_path and
cost, every term through the public functions), the free device memory asked only where spgemm()
asks for it, for random features of every path. CPU only."""
import dataclasses
import math

import numpy as np
import pytest

from matplan.core import device as device_mod
from matplan.core.features import Features
from matplan.core.types import Cost
from matplan.kernels import get
from matplan.kernels.spgemm import global_rows, kernel as hash_kernel, panels, rules, runtime
from matplan.models import spgemm as spgemm_model, traffic

DEVICES = [device_mod.known(name) for name in ("H100", "A100", "V100", "K40c")]


def reference_describe_groups(f, smem_bytes):
    itemsize = np.dtype(f.dtype).itemsize
    ladder = rules.table_ladder(smem_bytes, rules.KEY_BYTES + itemsize)
    balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
    alpha_max = f.rowct_max / spgemm_model.RBS_COMPRESSION
    n_global = 0
    if min(alpha_max, f.k) > ladder[-1]:
        n_global = max(1, f.rbs_groups[-1] if f.rbs_groups else 1) if alpha_max > 4 * ladder[-1] else 1
    groups = ", ".join(f"{c:,} rows alpha in [{lo},{hi})" for lo, hi, c in
                       zip(spgemm_model.RBS_GROUP_BOUNDS, spgemm_model.RBS_GROUP_BOUNDS[1:] + ("inf",),
                           f.rbs_groups) if c)
    mode = (f"balanced (var/mean of nnz_RowCt {f.rowct_var_over_mean:.2f} <= "
            f"{spgemm_model.RBS_BALANCED_RATIO}): one table size" if balanced else
            f"grouped (var/mean {f.rowct_var_over_mean:.2f} > {spgemm_model.RBS_BALANCED_RATIO}): {groups}")
    glob = (f"largest row alpha = {alpha_max:,.0f} exceeds the {ladder[-1]}-slot shared table, so about "
            f"{n_global} row(s) go to the global-memory path" if n_global else
            f"every row fits a shared table (largest {ladder[-1]} slots, alpha max {alpha_max:,.0f})")
    return balanced, f"{mode}; {glob}", n_global


def reference_hash_path(f, smem_bytes):
    itemsize = np.dtype(f.dtype).itemsize
    top = rules.table_ladder(smem_bytes, rules.KEY_BYTES + itemsize)[-1]
    caps = rules.esc_caps(f.k)
    if rules.one_pass_table(f.rowct_max, f.k, top, f.products, itemsize, total_bytes=math.inf,
                            esc_cap=(caps or (0,))[-1]):
        balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
        return "one pass, balanced" if balanced else "one pass, grouped"
    long_rows = sum(f.rbs_groups[4:]) if len(f.rbs_groups) > 4 else f.m
    if rules.one_pass_long(long_rows, f.k, f.products, itemsize, total_bytes=math.inf):
        return "one pass, grouped"
    if caps and long_rows <= spgemm_model.HYBRID_LONG_ROWS * f.m and f.rowct_max / spgemm_model.RBS_COMPRESSION <= top:
        return "hybrid"
    return "two passes"


def reference_hash_cost(f, device, free):
    """HashSpGEMM.cost as it was, ``free`` the device's free bytes it asked for (None: not asked)."""
    itemsize = np.dtype(f.dtype).itemsize
    balanced, why, n_global = reference_describe_groups(f, device.smem_per_block)
    path = reference_hash_path(f, device.smem_per_block)
    slab_bytes = 0.0
    seg = (global_rows.global_seg_shape(f.k, itemsize, device.smem_per_block, n_global, device.sms)
           if n_global else None)
    if n_global and seg is None:
        slab_bytes = n_global * f.k * (rules.KEY_BYTES + itemsize) * 2
        why += f" (dense slabs of {f.k:,} columns in global memory)"
    elif n_global:
        why += f" (by {seg[1]} column segment(s) of {seg[0]:,} columns in shared memory)"
    launches = 2 * (1 if balanced else sum(1 for c in f.rbs_groups if c)) + (2 if n_global else 0)
    caps = rules.esc_caps(f.k)
    direct = bool(caps) and f.rowct_max <= caps[-1]
    t = reference_hash_seconds(f, device, path, launches, slab_bytes, direct)
    _, panels_why = panels.predict_panels(traffic.spgemm_nnz_c(f), f.m, itemsize, free)
    sort = ("" if not caps else
            f"; every row sorted in registers (numeric_esc: at most {caps[-1]} products a row)"
            if f.rowct_max <= caps[-1] else
            f"; rows of at most {caps[-1]} products sorted in registers (numeric_esc), the others hashed")
    fixed = spgemm_model.HASH_FIXED_S[spgemm_model.hash_fixed_key(path, direct)]
    return Cost(0.0, t, f"RBSparse hash, {path}{', direct' if direct and path.startswith('one pass') else ''} "
                        f"({fixed * 1e3:.2f} ms fixed), "
                        f"{why}{sort}; {reference_hash_terms(f, path, direct)}"
                        + (f"; {panels_why}" if panels_why else "")
                + f"; a plan's runs from the third on an unchanged pattern replay values only "
                  f"(~{reference_values_replay_seconds(f, device) * 1e3:.3f} ms where its kept bytes fit)")


def reference_hash_seconds(f, device, path, launches, slab_bytes=0.0, direct=False):
    nbytes, _, _ = spgemm_model.fitted_bytes(f, spgemm_model.HASH_BYTES)
    nbytes += (spgemm_model.hash_table_nnz(f, path, direct) * spgemm_model.HASH_TABLE_BYTES
               + f.m * spgemm_model.HASH_ROW_BYTES)
    t = (nbytes + slab_bytes) / device.mem_bandwidth
    return t + spgemm_model.HASH_FIXED_S[spgemm_model.hash_fixed_key(path, direct)] + launches * spgemm_model.LAUNCH_S


def reference_hash_terms(f, path, direct):
    per_product, per_output = traffic.for_dtype(spgemm_model.HASH_BYTES, f)
    tables = spgemm_model.hash_table_nnz(f, path, direct)
    return (f"~{traffic.spgemm_nnz_c(f):,.0f} nonzeros of C expected ({spgemm_model.compression_text(f)}); "
            f"{per_product:.0f} B per product + {per_output:.0f} B per nonzero of C"
            + (f" + {spgemm_model.HASH_TABLE_BYTES:.0f} B per nonzero of C from hash tables" if tables else
               " (all from numeric_esc)")
            + f" + {spgemm_model.HASH_ROW_BYTES:.0f} B per row at the copy bandwidth")


def reference_values_replay_seconds(f, device):
    item = 4 if str(f.dtype) == "float32" else 8
    nbytes = f.products * (8 + item / 2) + traffic.spgemm_nnz_c(f) * (4 + item + 16)
    return nbytes / device.mem_bandwidth + spgemm_model.VALUES_FIXED_S


def random_features(rng, i):
    """SpGEMM features of every hash path: short, long and global rows, B narrow and past
    numeric_esc's columns, no products, with and without a sampled compression, both dtypes."""
    m = int(rng.choice([1, 7, 1000, 10_000, 300_000, 5_000_000]))
    k = int(rng.choice([1, 64, 10_000, 2_000_000, 50_000_000, (1 << 24) + 3, 200_000_000]))
    mean = float(rng.choice([0.0, 3.0, 100.0, 900.0, 40_000.0]) * rng.uniform(0.5, 1.5))
    rowct_max = int(mean * rng.choice([1.0, 1.3, 8.0, 400.0])) if mean else 0
    products = int(round(mean * m))
    if i % 3 == 0:   # balanced
        groups = [0] * 6
        groups[int(np.searchsorted(spgemm_model.RBS_GROUP_BOUNDS, mean / math.pi, side="right")) - 1] = m
        var = float(rng.choice([0.0, 0.3]))
    else:
        cuts = np.sort(rng.integers(0, m + 1, 5))
        groups = np.diff(np.concatenate([[0], cuts, [m]])).tolist()
        if i % 5 == 0:
            groups = groups[:5] + [int(rng.integers(0, 50))]
        var = float(rng.uniform(0.6, 5000.0))
    return Features(op="spgemm", dtype=str(rng.choice(["float32", "float64"])), backend="gpu", m=m, n=m, k=k,
                    nnz=m * 4, nnz_b=m * 4, products=products, rowct_mean=mean, rowct_max=rowct_max,
                    rowct_var_over_mean=var if mean else 0.0, rbs_groups=tuple(int(g) for g in groups),
                    compression=float(rng.choice([0.0, 1.0, 2.7, 40.0])), index_dtype="int32")


FEATURES = [random_features(np.random.default_rng(seed), seed) for seed in range(400)]


def test_the_features_reach_every_path_and_text():
    seen = {reference_hash_path(f, d.smem_per_block) for f in FEATURES for d in DEVICES}
    assert seen == set(spgemm_model.HASH_FIXED_S) - {"one pass, direct"}
    whys = [reference_hash_cost(f, d, None).why for f in FEATURES for d in DEVICES]
    for part in ("balanced (", "grouped (", "dense slabs", "column segment", "from hash tables",
                 "(all from numeric_esc)", "the others hashed", "row panels", ", direct"):
        assert any(part in w for w in whys), part
    assert any(f.products == 0 for f in FEATURES) and any(not rules.esc_caps(f.k) for f in FEATURES)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
def test_hash_cost_is_the_reference(device):
    hs, smem = get("spgemm.hash"), device.smem_per_block
    for f in FEATURES:
        assert hs.cost(f, {"sort": True}, device) == reference_hash_cost(f, device, None)
        assert hash_kernel.describe_groups(f, smem) == reference_describe_groups(f, smem)
        assert hash_kernel.hash_path(f, smem) == reference_hash_path(f, smem)
        for path in spgemm_model.HASH_FIXED_S:
            for direct in (False, True):
                for launches, slabs in ((2, 0.0), (7, 1e9)):
                    assert (spgemm_model.hash_seconds(f, device, path, launches, slabs, direct)
                            == reference_hash_seconds(f, device, path, launches, slabs, direct))
                assert spgemm_model.hash_terms(f, path, direct) == reference_hash_terms(f, path, direct)
        assert spgemm_model.values_replay_seconds(f, device) == reference_values_replay_seconds(f, device)


def test_free_memory_is_asked_only_where_spgemm_asks(monkeypatch):
    """On a measured device the free memory is queried (a driver call) only for a C past
    SMALL_OUTPUT_FRACTION of the device's memory, where spgemm() checks it too; there the text
    names the panels as before. Below it spgemm() refuses nothing, and the cost is the one made
    without device memory."""
    total = 80 * 10 ** 9
    queries = []

    def free_bytes():
        queries.append(1)
        return free[0]
    monkeypatch.setattr(hash_kernel, "cupy_module", lambda: object())
    monkeypatch.setattr(runtime, "_device_total_bytes", lambda: total)
    monkeypatch.setattr(runtime, "_free_device_bytes", free_bytes)
    device = dataclasses.replace(device_mod.known("H100"), source="measured")
    hs = get("spgemm.hash")
    near = 0
    for f in FEATURES:
        need = panels.panel_bytes(traffic.spgemm_nnz_c(f), f.m + 1, np.dtype(f.dtype).itemsize)
        for free in ([10 ** 6], [total // 2], [total]):
            queries.clear()
            got = hs.cost(f, {}, device)
            asked = need > runtime.SMALL_OUTPUT_FRACTION * total
            assert len(queries) == asked
            assert got == reference_hash_cost(f, device, free[0] if asked else None)
            near += asked and "free device memory" in got.why
    assert near   # some C past the free memory: the panels named with it
