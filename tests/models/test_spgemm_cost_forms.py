"""The SpGEMM cost forms (models/spgemm.py): the segmented merge's rounds follow spt_sort's loop and
its cost grows with the rows' lengths at fixed products; the hash's fixed cost follows the path,
its repeated one-pass calls where every row takes numeric_esc (direct) the cheapest; a row costs
apart from its products. CPU only."""
import dataclasses
import math

import pytest
import scipy.sparse as sp

from matplan.core import device as device_mod
from matplan.core import features as stats
from matplan.core.features import Features
from matplan.core.validation import normalize
from matplan.kernels import get
from matplan.kernels.sptrans import compiled as sptrans
from matplan.models import spgemm as spgemm_model, traffic

H100 = device_mod.known("H100")
TILE = sptrans.TILE


def _spt_sort_rounds(longest: int, tile: int) -> int:
    """The loop of spt_sort's phase 4 (sptrans/merge.cu), run on the host."""
    qmax = 1 + (longest - 1 + tile - 1) // tile if longest > 1 else 1
    r, s = 0, 1
    while s < qmax:
        s, r = 2 * s, r + 1
    return r


@pytest.mark.parametrize("longest", [0, 1, 2, 100, TILE, TILE + 1, 2 * TILE, 2 * TILE + 1, 5 * TILE,
                                     1000 * TILE + 7])
def test_merge_rounds_follow_spt_sort(longest):
    assert spgemm_model.merge_rounds(longest, TILE) == _spt_sort_rounds(longest, TILE)


def _spgemm_features(m, products, rowct_mean, var_over_mean, rowct_max, dtype="float64"):
    return Features(op="spgemm", backend="gpu", dtype=dtype, index_dtype="int32", m=m, n=m, k=m,
                    nnz=m * 8, nnz_b=m * 8, products=products, rowct_mean=rowct_mean,
                    rowct_max=rowct_max, rowct_var_over_mean=var_over_mean, compression=2.0,
                    rbs_groups=(m, 0, 0, 0, 0, 0))


def test_merge_cost_grows_with_row_length_at_fixed_products():
    """Same products, longer rows: more of them cross tiles and take tree rounds (ice40, R-MAT and
    block-dense cost ~2x a short-row product's time, not (1 + the longest row's rounds)x)."""
    products = 10_000_000
    short = _spgemm_features(200_000, products, 50.0, 2.0, 120)
    long_ = _spgemm_features(400, products, 25_000.0, 1.0, 25_600)
    t_short = spgemm_model.merge_cost(short, H100, TILE).run_s
    t_long = spgemm_model.merge_cost(long_, H100, TILE).run_s
    assert 1.3 < t_long / t_short < 3.0
    rounds = spgemm_model.merge_rounds(long_.rowct_max, TILE)
    per_product = spgemm_model.MERGE_BYTES_PER_PRODUCT / H100.mem_bandwidth
    # the products' rounds never pass the longest row's: an upper bound of the form
    assert t_long <= (spgemm_model.MERGE_FIXED_S + rounds * spgemm_model.MERGE_ROUND_S
                      + (products + long_.m) * per_product
                      + products * rounds * spgemm_model.MERGE_ROUND_BYTES / H100.mem_bandwidth)


def test_merge_cost_is_linear_in_products_for_short_rows():
    a = _spgemm_features(100_000, 5_000_000, 50.0, 1.0, 60)
    b = dataclasses.replace(a, m=200_000, products=10_000_000)
    fixed = spgemm_model.MERGE_FIXED_S + spgemm_model.merge_rounds(60, TILE) * spgemm_model.MERGE_ROUND_S
    ta, tb = (spgemm_model.merge_cost(f, H100, TILE).run_s - fixed for f in (a, b))
    assert tb == pytest.approx(2 * ta, rel=1e-9)


def test_merge_kernel_prices_with_spt_sort_tiles():
    f = _spgemm_features(50_000, 2_000_000, 40.0, 3.0, 9000)
    assert get("spgemm.merge").cost(f, {}, H100).run_s == spgemm_model.merge_cost(f, H100, TILE).run_s


def _features(A, B):
    return stats.compute(normalize(A, B), H100)


def test_hash_fixed_cost_follows_the_path_and_direct_calls():
    assert spgemm_model.hash_fixed_key("one pass, balanced", True) == "one pass, direct"
    assert spgemm_model.hash_fixed_key("one pass, grouped", True) == "one pass, direct"
    assert spgemm_model.hash_fixed_key("one pass, grouped", False) == "one pass, grouped"
    assert spgemm_model.hash_fixed_key("two passes", True) == "two passes"   # no guess: no direct call
    fixed = spgemm_model.HASH_FIXED_S
    assert fixed["one pass, direct"] < min(fixed["one pass, balanced"], fixed["one pass, grouped"])
    assert max(fixed["one pass, balanced"], fixed["one pass, grouped"]) < fixed["two passes"]
    n = 3000
    band = sp.diags([1.0, 2.0, 1.0], [-1, 0, 1], shape=(n, n), format="csr")   # 3 products a row
    c = get("spgemm.hash").cost(_features(band, band), {"sort": True}, H100)
    assert "direct" in c.why and c.run_s >= fixed["one pass, direct"]
    assert c.run_s < fixed["one pass, balanced"] + 1e-4


def test_hash_charges_rows_apart_from_products():
    """world_highways (560k rows of ~10 products) costs ~2x Poisson of the same products over
    110-160k rows: the same products over more rows cost more."""
    few = _spgemm_features(100_000, 5_000_000, 50.0, 1.0, 60)
    many = dataclasses.replace(few, m=500_000, rowct_mean=10.0)
    t_few = spgemm_model.hash_seconds(few, H100, "one pass, balanced", 2, direct=True)
    t_many = spgemm_model.hash_seconds(many, H100, "one pass, balanced", 2, direct=True)
    assert t_many - t_few == pytest.approx(400_000 * spgemm_model.HASH_ROW_BYTES / H100.mem_bandwidth, rel=1e-9)
    assert math.isfinite(t_many) and t_many > t_few


def test_hash_charges_nonzeros_that_tables_make():
    """A nonzero of C from a hash table (inserted, sorted in shared memory, buffered and compacted)
    costs HASH_TABLE_BYTES more than one numeric_esc sorts in registers and writes once."""
    f = _spgemm_features(100_000, 5_000_000, 50.0, 1.0, 60)
    assert spgemm_model.hash_table_nnz(f, "one pass, grouped", True) == 0.0
    assert spgemm_model.hash_table_nnz(f, "one pass, grouped", False) == traffic.spgemm_nnz_c(f)
    assert spgemm_model.hash_table_nnz(f, "two passes", True) == traffic.spgemm_nnz_c(f)   # no numeric_esc
    esc = spgemm_model.hash_seconds(f, H100, "one pass, grouped", 4, direct=True)
    tables = spgemm_model.hash_seconds(f, H100, "one pass, grouped", 4, direct=False)
    extra = traffic.spgemm_nnz_c(f) * spgemm_model.HASH_TABLE_BYTES / H100.mem_bandwidth
    fixed = spgemm_model.HASH_FIXED_S["one pass, grouped"] - spgemm_model.HASH_FIXED_S["one pass, direct"]
    assert tables - esc == pytest.approx(extra + fixed, rel=1e-9)
