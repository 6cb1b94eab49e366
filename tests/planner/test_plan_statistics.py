"""A plan measures only the statistics its candidates read: host plans (SciPy's one kernel costs
bytes) leave the ELL-R warp lengths, the column spread and SpTRANS's longest column NOT_MEASURED,
and say so; a candidate that reads them, or a learned model, brings them back."""
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import random_csr

from matplan import planner
from matplan.core import features as stats
from matplan.core.types import Cost
from matplan.core.validation import normalize
from matplan.kernels import registry
from matplan.kernels.cpu import ScipySparse
from matplan.models import learned

SKIPPED = ("warp_len_before", "warp_len_after", "warp_ratio", "col_spread")


class _Reads(ScipySparse):
    """A host kernel whose cost reads the row statistics (as the GPU SpMV kernels' do)."""
    name = "test.reads_rows"

    def reads_detailed_statistics(self, op):
        return True

    def cost(self, f, params, device):
        assert stats.measured(f.col_spread) and stats.measured(f.warp_ratio)
        return Cost(0.0, 1.0, "reads the spread")


@pytest.mark.parametrize("k", [1, 4])
def test_host_plans_skip_what_no_candidate_reads(rng, k):
    A = random_csr(rng, 300, 200, 0.05)
    B = rng.random(200) if k == 1 else rng.random((200, k))
    p = planner.plan(A, B, measure="never")
    full = stats.compute(normalize(A, B), None)
    for name in SKIPPED:
        assert getattr(p.features, name) == stats.NOT_MEASURED and not stats.measured(getattr(p.features, name))
        assert stats.measured(getattr(full, name))
    for name in ("nnz", "row_mean", "row_std", "row_min", "row_max", "empty_rows", "T", "col_max"):
        assert getattr(p.features, name) == getattr(full, name)
    text = str(p)
    assert "warp lengths and column spread not measured" in text and "ELL-R rule" not in text
    assert np.allclose(p.run(A, B), A @ B)


def test_a_candidate_that_reads_them_gets_them(rng, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, _Reads.name, _Reads())
    A, x = random_csr(rng, 300, 200, 0.05), rng.random(200)
    p = planner.plan(A, x, measure="never")
    full = stats.compute(normalize(A, x), None)
    assert all(getattr(p.features, name) == getattr(full, name) for name in SKIPPED)
    assert "ELL-R rule" in str(p)
    # restricted to the kernel that does not read them, the plan skips them again
    only = planner.plan(A, x, measure="never", kernels=["cpu.scipy"])
    assert only.features.col_spread == stats.NOT_MEASURED


def test_a_learned_model_for_the_host_gets_them(rng, monkeypatch):
    monkeypatch.setattr(learned, "model_for", lambda backend, dev: object() if backend == "cpu" else None)
    monkeypatch.setattr(learned, "rescored", lambda feats, dev, pending: [(c.prepare_s, c.run_s, None, "analytic")
                                                                          for _, _, c in pending])
    A, x = random_csr(rng, 300, 200, 0.05), rng.random(200)
    assert stats.measured(planner.plan(A, x, measure="never").features.col_spread)


def test_host_spgemm_and_sptrans_plans_skip_theirs(rng):
    A = random_csr(rng, 120, 120, 0.05)
    p = planner.plan(A, A, measure="never")
    full = stats.compute(normalize(A, A), None)
    assert p.features.col_spread == stats.NOT_MEASURED and stats.measured(full.col_spread)
    for name in ("rowct_max", "rowct_var_over_mean", "compression"):
        assert not stats.measured(getattr(p.features, name)) and stats.measured(getattr(full, name))
    assert p.features.rbs_groups == () and full.rbs_groups
    # its cost reads the products: counted exactly on a matrix this small
    assert p.features.products == full.products and p.features.rowct_mean == pytest.approx(full.rowct_mean)
    text = str(p)
    assert "RBSparse rule" not in text and "nnz_RowCt per row and the compression not measured" in text
    assert f"; {full.products:,} products; " in text
    assert np.allclose(p.run(A, A).toarray(), (A @ A).toarray())
    t = planner.plan_transpose(A, measure="never")
    assert t.features.col_max == stats.NOT_MEASURED and not stats.measured(t.features.col_max)
    assert t.features.row_max == A.getnnz(axis=1).max() and "SpTRANS rule" not in str(t)
    assert "longest not measured" in str(t)
    assert (t.run(A) != A.T.tocsr()).nnz == 0


def test_sampled_products(rng):
    """Exact up to PRODUCT_SAMPLES nonzeros of A; past them an estimate from every s-th nonzero,
    near the exact count on skewed rows of B, and said to be one in the plan."""
    small = random_csr(rng, 300, 200, 0.05)
    B = random_csr(rng, 200, 90, 0.1)
    assert stats.sampled_products(small, B) == stats.products_per_row(small, B).sum()
    assert stats.sampled_products(random_csr(rng, 0, 200, 0.1), B) == 0
    wide = random_csr(rng, 300, 200, 0.05, index_dtype=np.int64)   # int64 indices and indptr
    assert wide.indices.dtype == np.int64 and stats.sampled_products(wide, B) == stats.products_per_row(wide, B).sum()
    lengths = np.minimum(rng.zipf(1.8, 5_000), 2_000)   # skewed rows of B
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    B = sp.csr_matrix((np.ones(indptr[-1]), rng.integers(0, 4_000, indptr[-1]), indptr), shape=(5_000, 4_000))
    A = random_csr(rng, 20_000, 5_000, 0.004)
    assert A.nnz > 10 * stats.PRODUCT_SAMPLES
    exact = stats.products_per_row(A, B).sum()
    assert stats.sampled_products(A, B) == pytest.approx(exact, rel=0.1)
    p = planner.plan(A, B, measure="never")
    assert p.features.products == stats.sampled_products(A, B)
    assert f"~{p.features.products:,} products (from at most" in str(p) and stats.products_sampled(p.features)
    assert not stats.products_sampled(planner.plan(small, random_csr(rng, 200, 90, 0.1), measure="never").features)
