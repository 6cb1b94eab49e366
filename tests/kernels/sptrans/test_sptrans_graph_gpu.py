"""GPU tests of SpTRANS plans replayed as CUDA graphs (sptrans.replay.runner, matplan.kernels._graph):
every call against SciPy float64, the next call's spare outputs poisoned before it runs, earlier
results intact after later calls, A changed in place, several matrices and streams, and the inputs
that take the general path (int64 indices, an empty matrix)."""
import numpy as np
import pytest
import scipy.sparse as sp

from conftest import int64_indices, messy_csr, random_csr
from test_sptrans import _same_as_scipy, as_dtype
from test_sptrans_gpu import _col_lengths, _dev, returns_before_the_gpu

from matplan import planner
from matplan.kernels import _graph
from matplan.kernels.sptrans import kernel, replay

pytestmark = pytest.mark.gpu


@pytest.fixture
def runner(cp):
    if not _graph.available():
        pytest.fail("the driver's graph API did not load on a GPU machine")

    def make(method):
        return kernel.SpTrans().runner({"method": method})
    return make


def _poison(run):
    """Fill every kept graph's next outputs (spares) with garbage: an element a launch misses shows."""
    for rep in run.graphs.values():
        for a in rep.arrays:
            a.fill(np.nan if a.dtype.kind == "f" else -1)


def _case(rng, kind, dtype):
    if kind == "messy":   # duplicates, unsorted rows, one very long row, empty rows
        return as_dtype(messy_csr(rng, 700, 400), dtype)
    if kind == "long":    # columns in every segsort bin (thread, warp, block, chunk + merge)
        return as_dtype(_col_lengths(rng, 30000, [0, 1, 31, 33, 600, 5000, 9000] + list(rng.integers(0, 40, 300))),
                        dtype)
    return as_dtype(random_csr(rng, 20000, 70000, 0.001), dtype)   # three radix passes


@pytest.mark.parametrize("method", ["segsort", "radix"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["messy", "long", "wide"])
def test_replayed_calls_match_scipy(cp, runner, rng, method, dtype, kind):
    """Six calls on one A: the first through transpose (no graph kept), the second recorded, four
    replays, each into spares poisoned before it; every result stays SciPy's A.T after the later
    calls (no two calls share an output)."""
    A = _case(rng, kind, dtype)
    Ad = _dev(cp, A, dtype)
    run = runner(method)
    results = []
    for i in range(6):
        _poison(run)
        results.append(run(Ad, None))
        assert len(run.graphs) == (i > 0)
    ptrs = {a.data.ptr for T in results for a in (T.indptr, T.indices, T.data)}
    assert len(ptrs) == 18
    for T in results:
        assert T.shape == A.shape[::-1] and T.has_sorted_indices
        _same_as_scipy(A, T.get())


@pytest.mark.parametrize("method", ["segsort", "radix"])
def test_replay_reads_a_changed_in_place(cp, runner, rng, method):
    """A graph reads A's arrays at every launch: new values (the kept pattern's gather), and a
    new pattern of the same nnz written into the same arrays (the check fails, the method's
    launches run), come out in the next call; the key is then recorded again without a pattern."""
    A = random_csr(rng, 3000, 2000, 0.01)
    Ad = _dev(cp, A)
    run = runner(method)
    for _ in range(2):   # the first call, then the recorded one
        _same_as_scipy(A, run(Ad, None).get())
    Ad.data *= -2.0
    _same_as_scipy(A * -2.0, run(Ad, None).get())
    B = random_csr(rng, 3000, 2000, 0.01)
    while B.nnz != A.nnz:   # a pattern of the same nnz
        B = random_csr(rng, 3000, 2000, 0.01)
    Ad.data[...] = cp.asarray(B.data)
    Ad.indices[...] = cp.asarray(B.indices)
    Ad.indptr[...] = cp.asarray(B.indptr)
    (key, kept), = run.graphs.items()
    verdict = kept.pattern
    assert not verdict.changed()   # the replays so far found A's pattern as recorded
    _poison(run)
    _same_as_scipy(B, run(Ad, None).get())   # the method's launches, as the check failed
    assert len(run.graphs) == 1 and verdict.changed()
    for _ in range(2):   # recorded again, without a pattern (it may change again), then replayed
        _poison(run)
        _same_as_scipy(B, run(Ad, None).get())
    assert len(run.graphs) == 1 and run.graphs[key].pattern is None


def test_matrices_and_streams_get_graphs_of_their_own(cp, runner, rng):
    """Each A (its arrays) and stream is a graph of its own, at most GRAPH_CACHE_SIZE kept: three
    matrices in turn and a second stream all give SciPy's A.T."""
    run = runner("radix")
    mats = [random_csr(rng, 4000, 3000, 0.005) for _ in range(3)]
    devs = [_dev(cp, M) for M in mats]
    for _ in range(2):
        for M, Md in zip(mats, devs):
            _poison(run)
            _same_as_scipy(M, run(Md, None).get())
            assert len(run.graphs) <= replay.GRAPH_CACHE_SIZE
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        T = run(devs[0], None)
        T2 = run(devs[0], None)
        s.synchronize()
    assert s.ptr in {key[1] for key in run.graphs}
    _same_as_scipy(mats[0], T.get())
    _same_as_scipy(mats[0], T2.get())


@pytest.mark.parametrize("case", ["int64", "empty"])
def test_general_path_where_no_graph_is_kept(cp, runner, rng, case):
    """int64 indices (converted to new arrays each call) and an empty A are not replayed: the
    general path gives SciPy's A.T and no graph is kept."""
    A = sp.csr_matrix((40, 30)) if case == "empty" else messy_csr(rng, 500, 300)
    Ad = _dev(cp, A)
    if case == "int64":
        Ad = int64_indices(cp, Ad)
    run = runner("segsort")
    for _ in range(2):
        T = run(Ad, None)
        assert T.shape == (A.shape[1], A.shape[0])
        _same_as_scipy(A, T.get())
    assert not run.graphs


@pytest.mark.parametrize("method", ["segsort", "radix"])
def test_replay_does_not_wait_for_the_gpu(cp, runner, rng, method):
    """A replayed call only enqueues work: it returns while a long kernel queued ahead still runs
    (the spares' allocation and the graph's update are host work, no synchronisation)."""
    A = random_csr(rng, 2000, 2000, 0.01)
    Ad = _dev(cp, A)
    run = runner(method)
    run(Ad, None)
    run(Ad, None)
    assert len(run.graphs) == 1
    _same_as_scipy(A, returns_before_the_gpu(cp, lambda: run(Ad, None)).get())


def test_plan_run_replays(cp, rng):
    """plan_transpose(A).run(A) goes through the runner: a plan choosing the segsort or radix
    method keeps one graph after its first call and gives SciPy's A.T on every call."""
    A = random_csr(rng, 20000, 20000, 0.0005)
    Ad = _dev(cp, A)
    p = planner.plan_transpose(Ad, kernels=["sptrans.transpose"], measure="never")
    for _ in range(3):
        _same_as_scipy(A, p.run(Ad).get())
    assert len(p._fast[-1].graphs) == 1


def test_first_call_of_each_matrix_keeps_no_graph(cp, runner, rng):
    """A plan applied once to each of many matrices records nothing: a matrix's first call goes
    through transpose, its second records; the matrices remembered stay bounded."""
    run = runner("segsort")
    mats = [random_csr(rng, 500, 400, 0.01) for _ in range(4 * replay.GRAPH_CACHE_SIZE + 3)]
    devs = [_dev(cp, M) for M in mats]
    for M, Md in zip(mats, devs):
        _same_as_scipy(M, run(Md, None).get())
    assert not run.graphs
    _same_as_scipy(mats[-1], run(devs[-1], None).get())
    assert len(run.graphs) == 1
