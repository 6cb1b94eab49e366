"""SpMV / SpMM: CSR scalar, vector and SpMM kernels, ELL-R, BRCP, split and merge-path formats,
and cuSPARSE. ``formats`` builds the formats; ``gpu`` launches ``spmv.cu``; their costs are
:mod:`matplan.models.spmv`'s."""
from . import gpu, vendor  # noqa: F401  registers the kernels
