// Whether a CSR matrix is canonical (every row's column indices strictly increasing: sorted, no
// duplicates), for cuSPARSE's SpGEMM (vendor.py), which needs it: one warp a row, *not_canonical
// set where a row is not. CuPy's own check is a kernel compiled on first use.
template <typename I>
__global__ void csr_canonical(const I* __restrict__ indptr, const I* __restrict__ indices, long long m,
                              unsigned* __restrict__ not_canonical) {
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    bool bad = false;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < m; r += warps) {
        const long long end = (long long)indptr[r + 1] - 1;
        for (long long e = (long long)indptr[r] + lane; e < end; e += 32) bad |= indices[e] >= indices[e + 1];
    }
    if (__any_sync(0xffffffffu, bad) && lane == 0) *not_canonical = 1u;
}

template __global__ void csr_canonical<int>(const int*, const int*, long long, unsigned*);
template __global__ void csr_canonical<long long>(const long long*, const long long*, long long, unsigned*);
