// Pattern replays (SpTrans.runner): a plan's graph keeps, for an A met before, a copy of A's
// indptr and indices, A^T's indptr and indices and the permutation src (slot q of A^T holds entry
// src[q] of A). spt_same sets *changed where A's pattern now differs from the kept one; the full
// method's launches then run only where *changed (their only_if argument), into scratch arrays;
// spt_finish writes A^T: from the kept arrays and A's values (src gathers them), or, where
// *changed, from the scratch. Only spt_finish names A^T's arrays (a replay moves one node).
extern "C" __global__ void spt_same(const int* __restrict__ a_indptr, const int* __restrict__ indices,
                                    const int* __restrict__ kept_indptr, const int* __restrict__ kept_indices,
                                    int m, long long nnz, unsigned* __restrict__ changed) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    bool differ = false;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nnz || i <= m; i += stride)
        differ |= (i < nnz && indices[i] != kept_indices[i]) || (i <= m && a_indptr[i] != kept_indptr[i]);
    if (__syncthreads_or(differ) && threadIdx.x == 0) *changed = 1u;
}

// A's positions 0..nnz-1 as values (exact in double below 2^53), transposed to give src.
extern "C" __global__ void spt_positions(double* __restrict__ out, long long nnz) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nnz; i += stride) out[i] = (double)i;
}

// src from the transposed positions (below 2^31: int32 indices).
extern "C" __global__ void spt_src(const double* __restrict__ positions, int* __restrict__ src, long long nnz) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nnz; i += stride)
        src[i] = (int)positions[i];
}

template <typename T>
__global__ void spt_finish(const unsigned* __restrict__ changed, const int* __restrict__ src,
                           const T* __restrict__ data, const int* __restrict__ kept_t_indptr,
                           const int* __restrict__ kept_t_indices, const int* __restrict__ full_indptr,
                           const int* __restrict__ full_indices, const T* __restrict__ full_data,
                           long long nnz, int n, int* __restrict__ indptr, int* __restrict__ out_idx,
                           T* __restrict__ out_val) {
    const bool full = *changed != 0u;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < nnz || q <= n; q += stride) {
        if (q < nnz) {
            out_val[q] = full ? full_data[q] : data[src[q]];
            out_idx[q] = full ? full_indices[q] : kept_t_indices[q];
        }
        if (q <= n) indptr[q] = full ? full_indptr[q] : kept_t_indptr[q];
    }
}

template __global__ void spt_finish<float>(const unsigned*, const int*, const float*, const int*, const int*,
                                           const int*, const int*, const float*, long long, int, int*, int*,
                                           float*);
template __global__ void spt_finish<double>(const unsigned*, const int*, const double*, const int*, const int*,
                                            const int*, const int*, const double*, long long, int, int*, int*,
                                            double*);
