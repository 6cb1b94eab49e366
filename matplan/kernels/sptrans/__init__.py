"""SpTRANS (A.T as CSR): segmented sort, radix and segmented merge methods, and cuSPARSE csr2csc."""
from . import gpu, vendor  # noqa: F401  registers the kernels
