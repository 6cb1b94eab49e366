"""SpTRANS cost model: the fitted constants of the cuSPARSE candidate (csr2csc)."""
from __future__ import annotations

#: cuSPARSE's csr2csc through CuPy (``A.T.tocsr()``): (fixed seconds, bytes an entry of A at the
#: copy bandwidth) by dtype, relative least squares (benchmarks/sptrans_fit.py) over two runs of
#: benchmarks/sptrans.py on an H100 (c148a21, 14 matrices each; measured / model 0.87-1.16).
CUSPARSE_TRANSPOSE_COSTS = {"float64": (135.4e-6, 177.5), "float32": (126.4e-6, 183.7)}
