"""SpGEMM planning where one operand is small enough for host statistics and the other is not:
both are then measured where they live (one array module), with the same figures as SciPy's."""
import numpy as np
import pytest
import scipy.sparse as sp

import matplan
from matplan.core import device, features, validation, xp

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("small", ["A", "B"])
def test_spgemm_plans_with_one_operand_on_the_host_path(cp, monkeypatch, small):
    import cupyx.scipy.sparse as csp
    monkeypatch.setattr(xp, "HOST_STATS_NNZ", 2000)
    dense = dict(A=0.05, B=0.05)
    dense[small] = 0.002
    A = sp.random(600, 500, density=dense["A"], format="csr", random_state=3)
    B = sp.random(500, 400, density=dense["B"], format="csr", random_state=4)
    A.data += 0.5
    B.data += 0.5
    Ad, Bd = csp.csr_matrix(A), csp.csr_matrix(B)
    assert (xp.host_index_arrays(Ad) is None) != (xp.host_index_arrays(Bd) is None)
    p = matplan.plan(Ad, Bd, measure="never")
    C = p.run(Ad, Bd)
    want = A @ B
    assert C.nnz == want.nnz and abs(C.get() - want).max() <= 1e-12 * abs(want).max()
    host = features.compute(validation.normalize(A, B), device.current())   # all measured, as a GPU plan's
    for name in ("products", "rowct_max", "rowct_mean", "row_max", "nnz_b"):
        assert getattr(p.features, name) == getattr(host, name), name
    assert isinstance(features.products_per_row(Ad, Bd), cp.ndarray)
