"""How close can any CSR-order SpMV get to the copy bandwidth? Bounds measured on the device.

    PYTHONPATH=. python3 benchmarks/spmv_bounds.py [--out DIR] [--families uniform rmat ...]

``benchmarks/spmv.py`` reports each kernel's ``frac_of_copy_bw``: the CSR SpMV's minimum traffic
(values, indices, indptr, x, y once) / time / copy bandwidth. A kernel that reads A in its stored
order must also gather x[indices[p]] once per nonzero, and on random columns each gather brings a
32-byte sector (from L2 when x fits there) for 4 or 8 useful bytes. This script times, on the same
matrices, three flat kernels that ignore the rows (a warp sums 32 consecutive nonzeros, perfectly
balanced, so no row-length effect counts against them):

* ``stream``: values and indices read, no gather (what the CSR bytes alone cost);
* ``gather``: indices read and x gathered, no values (the random-access cost alone);
* ``flat``: values, indices and the gather: the work of an SpMV without its row structure.

``bound_frac`` = the CSR minimum traffic / ``flat`` time / copy bandwidth: the fraction of copy
bandwidth an SpMV reading A in CSR order could reach at best on that matrix. Times are
back-to-back medians (20 calls between two CUDA events, 7 rounds), as spmv.py's b2b figures;
the copy bandwidth is measured the same way in the same run. Output: ``results/spmv_bounds-<device>.json``,
then ``results/SUMMARY.md`` regenerated.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _common import git_commit, queued_s, write_result  # noqa: E402
from summarize import write_summary  # noqa: E402

from matplan import corpus  # noqa: E402

FAMILIES = ("uniform", "rmat", "skewed", "poisson3d", "banded", "block_dense")

SRC = r"""
// MODE 0 stream (values + indices), 1 gather (indices + x), 2 flat (values, indices, x).
// A warp takes 4 x 32 consecutive nonzeros a step (loads first, then adds), grid-stride.
template <typename T, int MODE>
__global__ void flat(const long long nnz, const int* __restrict__ indices,
                     const T* __restrict__ data, const T* __restrict__ x, T* __restrict__ out) {
    T s = 0;
    const long long stride = (long long)gridDim.x * blockDim.x * 4;
    for (long long p0 = ((long long)blockIdx.x * blockDim.x + (threadIdx.x & ~31)) * 4 + (threadIdx.x & 31);
         p0 < nnz; p0 += stride) {
        int c[4]; T v[4], xv[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long p = p0 + 32 * u;
            c[u] = p < nnz ? indices[p] : 0;
            v[u] = (MODE != 1 && p < nnz) ? data[p] : T(1);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) xv[u] = MODE == 0 ? T(c[u]) : x[c[u]];
#pragma unroll
        for (int u = 0; u < 4; ++u) s += v[u] * xv[u];
    }
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if ((threadIdx.x & 31) == 0) out[((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32] = s;
}
"""
MODES = ("stream", "gather", "flat")
CALLS, ROUNDS = 20, 7


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--families", nargs="+", default=list(FAMILIES))
    args = ap.parse_args(argv)
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    names = [f"flat<{t},{m}>" for t in ("double", "float") for m in range(3)]
    mod = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=names)
    src = cp.random.random(1 << 25)
    dst = cp.empty_like(src)
    copy_bw = 2 * src.nbytes / queued_s(cp, lambda: cp.copyto(dst, src), CALLS, ROUNDS)
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    gpu = dev["name"].decode() if isinstance(dev["name"], bytes) else str(dev["name"])
    sms = dev["multiProcessorCount"]
    print(f"# {gpu}, commit {git_commit()}: copy bandwidth {copy_bw / 1e9:.0f} GB/s "
          f"(back to back, read + write)")
    print(f"{'matrix':18s} {'dtype':8s} {'nnz':>11s} {'stream us':>9s} {'gather us':>9s} {'flat us':>8s} "
          f"{'cuSP us':>8s} {'bound_frac':>10s}")
    rng = np.random.default_rng(0)
    rows = []
    for fam in args.families:
        S = corpus.load(fam, "large").tocsr()
        for dt in (np.float64, np.float32):
            A = csp.csr_matrix(sp.csr_matrix(S, dtype=dt))
            A.data[:] = cp.asarray(rng.standard_normal(A.nnz).astype(dt))   # never time on zeros
            x = cp.asarray(rng.standard_normal(A.shape[1]).astype(dt))
            m, n, nnz, isz = A.shape[0], A.shape[1], A.nnz, np.dtype(dt).itemsize
            csr_bytes = nnz * (isz + 4) + (m + 1) * 4 + (m + n) * isz
            blocks = min(sms * 8, max(1, (nnz + 1023) // 1024))
            out = cp.empty(blocks * 256 // 32, dtype=dt)
            t = "double" if dt == np.float64 else "float"
            us = {}
            for mode, label in enumerate(MODES):
                kern = mod.get_function(f"flat<{t},{mode}>")
                args_ = (np.int64(nnz), A.indices, A.data, x, out)
                us[label] = queued_s(cp, lambda: kern((blocks,), (256,), args_), CALLS, ROUNDS) * 1e6
            us["cusparse"] = queued_s(cp, lambda: A @ x, CALLS, ROUNDS) * 1e6
            row = dict(matrix=f"{fam}-large", dtype=np.dtype(dt).name, m=m, n=n, nnz=nnz, csr_min_bytes=csr_bytes,
                       stream_us=us["stream"], gather_us=us["gather"], flat_us=us["flat"], vendor_us=us["cusparse"],
                       bound_frac=csr_bytes / (us["flat"] * 1e-6) / copy_bw,
                       vendor_frac=csr_bytes / (us["cusparse"] * 1e-6) / copy_bw)
            rows.append(row)
            print(f"{row['matrix']:18s} {row['dtype']:8s} {nnz:11,d} {us['stream']:9.1f} {us['gather']:9.1f} "
                  f"{us['flat']:8.1f} {us['cusparse']:8.1f} {row['bound_frac']:10.2f}", flush=True)
    path = write_result(args.out, "spmv_bounds", gpu, dict(copy_bw=copy_bw, families=args.families, calls=CALLS,
                                                           rounds=ROUNDS, rows=rows))
    print(f"wrote {path} and {write_summary(args.out)}")


if __name__ == "__main__":
    main()
