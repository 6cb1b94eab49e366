"""Checks the distributed tests share, imported by name (pytest puts tests/distributed/ on sys.path)."""
import scipy.sparse as sp


def same(C, ref, rtol=1e-12):
    """C equals ref (both sparse or dense) within ``rtol`` of ref's largest entry (at least 1)."""
    C, ref = sp.csr_matrix(C), sp.csr_matrix(ref)
    assert C.shape == ref.shape
    assert abs(C - ref).max() <= rtol * max(abs(ref).max(), 1.0)
