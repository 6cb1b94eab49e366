"""The statistics kernel's figures finished in Python give NumPy's numbers bit for bit: the
moments by Python's float64 operations (ints below 2**53 convert exactly), the drawn rows'
compression where each row is drawn once (ints divided as floats), the leaf sum with its
accumulators in locals, and Features made without the dataclass's __init__ equal to it. CPU only."""
import dataclasses
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from matplan.core import compression as C, device as device_mod, features as F, figures, validation
from matplan.core.features import Features

H100 = device_mod.known("H100")


def _figs(rows, p, d, q, products=None):
    return figures.KernelFigures(a=figures.CsrFlags(False, False, False, False, 0, 1),
                                 products=int(sum(p)) if products is None else products,
                                 drawn=tuple(int(r) for r in rows), drawn_products=tuple(int(x) for x in p),
                                 distinct=tuple(int(x) for x in d), examined=tuple(int(x) for x in q))


def numpy_compression(rows, p, d, q, ncols):
    """the general path: numpy.unique of the drawn rows, then compression_of."""
    rows, p, d, q = (np.asarray(x, dtype=np.int64) for x in (rows, p, d, q))
    _, first, draws = np.unique(rows, return_index=True, return_counts=True)
    return C.compression_of(d[first], q[first], p[first], draws.astype(np.int64), ncols)


@pytest.mark.parametrize("seed", range(60))
def test_rows_drawn_once_give_numpys_compression(seed):
    """Rising rows each drawn once (the common case) take the int-division path: numpy's float,
    bit for bit, for counts up to and past 2**53 (these take the general path), rows not examined
    whole, and zero products."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(10 ** 6, C.COMPRESSION_SAMPLES, replace=False))
    top = [10, 10 ** 6, 10 ** 12, 2 ** 53 - 1, 2 ** 60][seed % 5]
    p = rng.integers(1, top, C.COMPRESSION_SAMPLES, dtype=np.int64)
    d = np.minimum(p, rng.integers(1, top, C.COMPRESSION_SAMPLES, dtype=np.int64))
    q = p + (rng.integers(0, 3, C.COMPRESSION_SAMPLES) if seed % 3 else -rng.integers(0, 2, C.COMPRESSION_SAMPLES))
    if seed % 7 == 0:
        p[rng.integers(C.COMPRESSION_SAMPLES)] = 0
    with np.errstate(divide="ignore", invalid="ignore"):   # a row of no products: 0 / 0 on the general path
        want = numpy_compression(rows, p, d, q, 10 ** 7)
        got = C.drawn_compression(_figs(rows, p, d, q, products=1), 10 ** 7)
    assert got == want and type(got) is float


def test_the_python_paths_are_taken_where_they_apply(monkeypatch):
    """Rows drawn once and rows drawn again (rising) do not reach numpy.unique; falling rows do."""
    rng = np.random.default_rng(5)
    once = np.sort(rng.choice(10 ** 5, C.COMPRESSION_SAMPLES, replace=False))
    again = np.sort(rng.integers(0, 30, C.COMPRESSION_SAMPLES))
    p = rng.integers(1, 10 ** 6, C.COMPRESSION_SAMPLES)
    calls = []
    unique = np.unique
    monkeypatch.setattr(F.np, "unique", lambda *a, **k: calls.append(1) or unique(*a, **k))
    for rows, via_numpy in ((once, False), (again, False), (once[::-1], True)):
        calls.clear()
        C.drawn_compression(_figs(rows, p, p // 2, p), 10 ** 6)
        assert bool(calls) == via_numpy


@pytest.mark.parametrize("n", [8, 9, 16, 63, 64, 65, 127, 128])
def test_leaf_sum_of_lists_and_arrays(n):
    """Lists and NumPy arrays (stats_reference passes slices of both), the array left as it was;
    zeros' signs aside, as the callers add 0.0."""
    v = np.random.default_rng(n).standard_normal(n) * 10.0 ** np.random.default_rng(n + 1).integers(-8, 8, n)
    want = float(np.add.reduce(v)) + 0.0
    kept = v.copy()
    assert C.leaf_sum(v.tolist()) + 0.0 == want and C.leaf_sum(v) + 0.0 == want
    assert np.array_equal(v, kept)


def reference_moments(figs, m, nnz):
    """from_figures' float figures as NumPy scalars computed them."""
    total = figs.a.ptrm - figs.a.ptr0
    return (float(np.float64(total) / m), float(np.sqrt(float(np.float64(figs.row_ss) / m))),
            float(np.float64(figs.spread_sum) / min(nnz, F.SPREAD_SAMPLES)),
            float(np.float64(figs.products) / m), float(np.float64(figs.rowct_ss) / m))


@pytest.mark.parametrize("seed", range(40))
def test_moments_in_python_floats_are_numpys(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.choice([1, 3, 10_000, 2 ** 31 - 1, 2 ** 40 + 7]))
    nnz = int(rng.integers(1, 2 ** 53))
    products = int(rng.integers(1, 2 ** 53))
    figs = figures.KernelFigures(a=figures.CsrFlags(False, False, False, False, 0, nnz),
                                 b=figures.CsrFlags(False, False, False, False, 0, 5),
                                 row_ss=float(rng.random() * 10.0 ** rng.integers(-3, 30)),
                                 spread_sum=float(rng.random() * 10.0 ** rng.integers(-3, 6)),
                                 products=products, rowct_ss=float(rng.random() * 10.0 ** rng.integers(-3, 30)),
                                 rowct_max=products, rbs_groups=(m, 0, 0, 0, 0, 0))

    class Csr:   # what from_figures reads of an operand: its shape and index dtype
        shape, indices = (m, 50), np.zeros(1, np.int32)
    mean, std, spread, rowct_mean, rowct_var = reference_moments(figs, m, nnz)
    out = F.from_figures("spgemm", figs, Csr(), Csr())
    assert (out["row_mean"], out["row_std"], out["col_spread"], out["rowct_mean"]) == (mean, std, spread, rowct_mean)
    assert out["rowct_var_over_mean"] == rowct_var / rowct_mean
    assert all(type(out[k]) is float for k in ("row_mean", "row_std", "col_spread", "rowct_mean",
                                                "rowct_var_over_mean"))


def test_sqrt_is_numpys_below_zero_too():
    for x in (0.0, -0.0, 2.0, 1e300, 5e-324):
        assert str(F._sqrt(x)) == str(float(np.sqrt(np.float64(x))))
    with np.errstate(invalid="ignore"):
        assert np.isnan(F._sqrt(-1.0)) and np.isnan(F._sqrt(float("nan")))


def _problems():
    rng = np.random.default_rng(2)
    A = sp.random(300, 200, density=0.03, format="csr", random_state=rng)
    return [validation.normalize(A, np.ones(200)), validation.normalize(A, np.ones((200, 4))),
            validation.normalize(A, A.T.tocsr()), validation.normalize_transpose(A),
            validation.normalize(rng.standard_normal((500, 16)), rng.standard_normal((16, 4)))]


@pytest.mark.parametrize("problem", _problems(), ids=["spmv", "spmm", "spgemm", "sptrans", "tsgemm"])
def test_features_made_without_init_are_features(problem):
    f = F.compute(problem, H100)
    made = Features(**dataclasses.asdict(f))
    assert f == made and hash(f) == hash(made) and repr(f) == repr(made) and f.to_dict() == made.to_dict()
    assert list(vars(f)) == list(vars(made))   # the fields in their order
    assert pickle.loads(pickle.dumps(f)) == f and dataclasses.replace(f, m=1).m == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.m = 3


def test_an_unknown_key_is_named_by_init():
    values = dict(op="spmv", dtype="float64", backend="cpu", m=1, n=1, k=1)
    assert F._features(values) == Features(**values)
    with pytest.raises(TypeError, match="row_maen"):
        F._features(dict(values, row_maen=1.0))


def test_the_fields_compute_sets_are_the_required_ones():
    """_features fills every other field from its default: a new required field, or one with a
    default factory, must be set by compute() (this fails first)."""
    fields = dataclasses.fields(Features)
    assert [f.name for f in fields if f.default is dataclasses.MISSING] == ["op", "dtype", "backend", "m", "n", "k"]
    assert all(f.default_factory is dataclasses.MISSING for f in fields)
    assert F._FIELD_DEFAULTS == {f.name: None if f.default is dataclasses.MISSING else f.default for f in fields}
