"""The cheaper SpGEMM costs give the figures and text of the old ones: spgemm.hash's cost with its
path, groups and nnz(C) taken once (the old functions: spgemm_old_costs.py), the free device
memory asked only where spgemm() asks for it, for random features of every path. CPU only."""
import dataclasses
import math

import numpy as np
import pytest

from matplan.core import device as device_mod
from matplan.core.features import Features
from matplan.kernels import get
from matplan.kernels.spgemm import kernel as hash_kernel, panels, rules, runtime
from matplan.models import spgemm as spgemm_model, traffic
from spgemm_old_costs import (reference_describe_groups, reference_hash_cost, reference_hash_path,
                              reference_hash_seconds, reference_hash_terms, reference_values_replay_seconds)

DEVICES = [device_mod.known(name) for name in ("H100", "A100", "V100", "K40c")]


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
