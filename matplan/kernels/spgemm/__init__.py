"""SpGEMM: the RBSparse hash kernels with their one-pass, guessed and panel paths, the segmented
merge kernel, and cuSPARSE."""
from . import gpu, merge, vendor  # noqa: F401  registers the kernels
