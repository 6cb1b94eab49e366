"""CPU tests of SpTRANS through the planner (planner.plan_transpose): the host path end to end, the
clear errors, the column statistics and the GPU candidates' cost models (no GPU needed)."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import messy_csr, random_csr
from test_sptrans import _same_as_scipy

from matplan import planner
from matplan.kernels.sptrans.kernel import SpTrans
from matplan.kernels.sptrans.vendor import CusparseTranspose
from matplan.models import sptrans as model
from matplan.core import device as device_mod
from matplan.core import features as stats
from matplan.core.validation import normalize_transpose


@pytest.mark.parametrize("make", ["random", "messy", "empty"])
def test_host_plan_runs_and_matches_scipy(rng, make):
    """On the host the plan takes SciPy and returns A.T in A's order (duplicates kept), through
    run, bind and a plan rebuilt from its JSON."""
    A = {"random": lambda: random_csr(rng, 300, 200, 0.05),
         "messy": lambda: messy_csr(rng, 120, 90),
         "empty": lambda: sp.csr_matrix((40, 30))}[make]()
    p = planner.plan_transpose(A)
    assert p.op == "sptrans" and p.kernel == "cpu.scipy" and p.backend == "cpu"
    for T in (p.run(A), p.bind(A)(), planner.Plan.from_dict(p.to_dict()).run(A)):
        assert sp.isspmatrix_csr(T)
        _same_as_scipy(A, T)
    assert "A.T of A" in p.reasons[0] and "sptrans" in str(p)


def test_transpose_features(rng):
    A = messy_csr(rng, 200, 50)
    f = stats.compute(normalize_transpose(A), device_mod.current())
    assert (f.op, f.k, f.m, f.n, f.nnz) == ("sptrans", 0, 200, 50, A.nnz)
    assert f.col_max == np.bincount(A.indices, minlength=50).max()
    assert f.row_max == np.diff(A.indptr).max() and f.row_mean == A.nnz / 200
    for empty in (sp.csr_matrix((5, 0)), sp.csr_matrix((0, 5)), sp.csr_matrix((4, 6))):
        assert stats.transpose_features(empty)["nnz"] == 0


def test_bad_inputs_are_named(rng):
    A = random_csr(rng, 30, 20, 0.2)
    with pytest.raises(TypeError, match="A: SpTRANS plans transpose a sparse matrix"):
        planner.plan_transpose(np.ones((3, 3)))
    with pytest.raises(TypeError, match="A: dtype int64"):
        planner.plan_transpose(sp.csr_matrix(np.eye(3, dtype=np.int64)))
    p = planner.plan_transpose(A)
    with pytest.raises(TypeError, match="B: a SpTRANS plan transposes A alone"):
        p.run(A, np.ones(20))
    with pytest.raises(TypeError, match="B: a SpTRANS plan transposes A alone"):
        p.bind(A)(np.ones(20))
    with pytest.raises(ValueError, match="A: this plan is for a 30x20 matrix"):
        p.run(random_csr(rng, 20, 30, 0.2))
    with pytest.raises(ValueError, match="this plan is for op 'spmv'"):   # an A @ B plan given no B
        planner.plan(A, np.ones(20)).run(A, np.ones((20, 2)))
    with pytest.raises(TypeError, match="B: this plan"):
        planner.plan(A, np.ones(20)).bind(A)()
    with pytest.raises(ValueError, match="out: not supported"):
        p.run(A, out=np.zeros((20, 30)))


def _features(n, nnz, col_max, dtype="float64", m=None):
    return stats.Features(op="sptrans", dtype=dtype, backend="gpu", m=n if m is None else m, n=n, k=0, nnz=nnz,
                          col_max=col_max)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cost_models_follow_the_longest_column(dtype):
    """First calls (run + prepare: what reuse=1 weighs): the segmented sort is the cheapest for short
    columns at ~1M+ entries (banded: 3.4M entries, longest 17), the radix method for long ones
    (wordnet: longest 59,512; the wide doc-term matrix: 755k columns, longest 33,070) and for small
    matrices; cuSPARSE is never predicted cheapest on these, as measured. Later runs on the same A
    are pattern replays, the same for both methods and cheaper than a first call; the merge method
    is never replayed."""
    h100 = device_mod.known("H100")
    kern, vendor = SpTrans(), CusparseTranspose()

    def costs(f):
        c = {m["method"]: kern.cost(f, m, h100) for m in kern.candidates(f, h100)}
        c["cusparse"] = vendor.cost(f, {}, h100)
        return c

    def first(c):
        return {k: v.run_s + v.prepare_s for k, v in c.items()}

    cases = {"banded": (_features(200_000, 3_399_928, 17, dtype), "segsort"),
             "wordnet": (_features(53_946, 1_328_517, 59_512, dtype), "radix"),
             "small": (_features(20_000, 100_000, 9, dtype), "radix"),
             "doc-term": (_features(755_000, 1_800_000, 33_070, dtype, m=47_000), "radix")}
    for name, (f, best) in cases.items():
        c = costs(f)
        t = first(c)
        assert min(t, key=t.get) == best, (name, t)
        assert t["cusparse"] > min(t.values())
        assert c["segsort"].run_s == c["radix"].run_s < min(t["segsort"], t["radix"])   # replays
        assert c["merge"].prepare_s == 0.0 and c["cusparse"].prepare_s == 0.0
    t = first(costs(cases["wordnet"][0]))
    assert t["segsort"] > 2 * t["radix"]
    why = kern.cost(_features(53_946, 1_328_517, 59_512), {"method": "segsort"}, h100).why
    assert "longest 59,512" in why and "doublings" in why and "replay" in why


def test_vendor_cost_grows_with_columns_and_entries():
    """cuSPARSE's fitted call: a fixed time plus entries and columns at the copy bandwidth, so
    the planner sees where it would win (a first call of ours costing more than its call)."""
    h100 = device_mod.known("H100")
    v = CusparseTranspose()
    base = v.cost(_features(100_000, 1_000_000, 10), {}, h100).run_s
    assert v.cost(_features(100_000, 2_000_000, 10), {}, h100).run_s > base
    assert v.cost(_features(1_000_000, 1_000_000, 10), {}, h100).run_s >= base
    fixed = model.CUSPARSE_TRANSPOSE_COSTS["float64"][0]
    assert fixed < base < fixed + 1e-3


def test_radix_not_offered_past_its_limit():
    f = _features(1000, model.RADIX_NNZ_LIMIT, 5)
    assert [p["method"] for p in SpTrans().candidates(f, None)] == ["segsort", "merge"]
    assert SpTrans().supports(_features(2**31, 10, 1)) is not None
