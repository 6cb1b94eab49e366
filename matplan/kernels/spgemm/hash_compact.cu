// The one-pass path's copy of C out of the upper-bound buffer (kernels/spgemm/numeric.py _compact).
// One pass: row i of the upper-bound buffer (Uj, Ux at csum[Ap[i]], Cp[i + 1] - Cp[i] entries) to
// C's exact offsets Cp[i]; compact_entries (below) where rows took the global path, else two
// mappings, chosen by C's mean row length (one_pass.COMPACT_RANGE_BELOW):
// * compact_rows: ``lanes`` (a power of two <= blockDim.x; 32 on the one-pass path) a row, grid-stride,
//   over the rows of ``rows`` (the hybrid's numeric_esc rows, lanes from their widest class) or all. H100, 8 lanes (4 rows a
//   warp) against a warp a row: Poisson 140 against 102 us, uniform 235 against 144.
// * compact_ranges: a block takes COMPACT_ROWS consecutive rows, whose output is one contiguous
//   range of C: thread t writes entries t, t + blockDim.x, ... of it (coalesced whatever the row
//   lengths) and finds each entry's row by a search over the rows' offsets in shared memory.
//   H100: world_highways (~7 entries a row, where a warp a row leaves most lanes idle)
//   116 -> 65 us; Poisson (24) 102 -> 106, uniform (64) 133 -> 158.
template <typename T>
__global__ void compact_rows(const int* __restrict__ Ap, const long long* __restrict__ csum,
                             const long long* __restrict__ Cp, const int* __restrict__ Uj,
                             const T* __restrict__ Ux, const int m, int* __restrict__ Cj, T* __restrict__ Cx,
                             const int* __restrict__ rows, const int lanes) {
    const int lane = threadIdx.x & (lanes - 1);
    const long long stride = (long long)gridDim.x * blockDim.x / lanes;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / lanes; r < m; r += stride) {
        const int i = rows ? rows[r] : (int)r;   // rows: the hybrid's numeric_esc rows only
        const long long src = csum[Ap[i]], dst = Cp[i], len = Cp[i + 1] - dst;
        for (long long q = lane; q < len; q += lanes) { Cj[dst + q] = Uj[src + q]; Cx[dst + q] = Ux[src + q]; }
    }
}

// The last row r in [lo, hi) with Cp[r] <= q, given Cp[lo] <= q < Cp[hi] (C's offsets in global or
// shared memory): compact_ranges and compact_entries.
__device__ __forceinline__ int row_of_entry(const long long* __restrict__ Cp, long long q, int lo, int hi) {
    while (hi - lo > 1) {
        const int mid = lo + ((hi - lo) >> 1);
        if (Cp[mid] <= q) lo = mid; else hi = mid;
    }
    return lo;
}

#define COMPACT_ROWS 256
template <typename T>
__global__ void __launch_bounds__(256) compact_ranges(
        const int* __restrict__ Ap, const long long* __restrict__ csum, const long long* __restrict__ Cp,
        const int* __restrict__ Uj, const T* __restrict__ Ux, const int m, int* __restrict__ Cj,
        T* __restrict__ Cx) {
    __shared__ long long s_dst[COMPACT_ROWS + 1], s_src[COMPACT_ROWS];
    const long long r0 = (long long)blockIdx.x * COMPACT_ROWS;
    const int nr = (int)min((long long)COMPACT_ROWS, m - r0);
    for (int t = threadIdx.x; t <= nr; t += blockDim.x) {
        s_dst[t] = Cp[r0 + t];
        if (t < nr) s_src[t] = csum[Ap[r0 + t]];
    }
    __syncthreads();
    const long long q1 = s_dst[nr];
    int lo = 0;   // the entries a thread visits only move forward: each search starts at the last row
    for (long long q = s_dst[0] + threadIdx.x; q < q1; q += blockDim.x) {
        lo = row_of_entry(s_dst, q, lo, nr);
        const long long src = s_src[lo] + (q - s_dst[lo]);
        Cj[q] = Uj[src];
        Cx[q] = Ux[src];
    }
}

// * compact_entries: a block takes COMPACT_ITEMS * blockDim.x consecutive entries of C, whatever rows
//   hold them: two threads find the rows of its first and last entries (binary search over Cp), each
//   thread the row of its first of COMPACT_ITEMS consecutive entries (a search between those rows),
//   then steps forward (a search again past empty rows); the entries' sources are staged in shared
//   memory and copied coalesced. A long row spreads over as many blocks as its entries fill, where
//   compact_rows gives it one block (skewed's 34 long rows) and compact_ranges the block of its range.
#define COMPACT_ITEMS 8
template <typename T>
__global__ void __launch_bounds__(256) compact_entries(
        const int* __restrict__ Ap, const long long* __restrict__ csum, const long long* __restrict__ Cp,
        const int* __restrict__ Uj, const T* __restrict__ Ux, const int m, const long long nnz,
        int* __restrict__ Cj, T* __restrict__ Cx) {
    __shared__ long long s_src[256 * COMPACT_ITEMS];
    __shared__ int s_rows[2];
    const long long q0 = (long long)blockIdx.x * (blockDim.x * COMPACT_ITEMS);
    const int span = (int)min((long long)blockDim.x * COMPACT_ITEMS, nnz - q0);
    if (threadIdx.x < 2)
        s_rows[threadIdx.x] = row_of_entry(Cp, threadIdx.x ? q0 + span - 1 : q0, 0, m);
    __syncthreads();
    const int r_first = s_rows[0], r_end = s_rows[1] + 1;   // Cp[r_end] > every entry of the block
    const int first = threadIdx.x * COMPACT_ITEMS;
    if (first < span) {
        long long q = q0 + first;
        int r = row_of_entry(Cp, q, r_first, r_end);
        long long start = Cp[r], next = Cp[r + 1], src = csum[Ap[r]];
        const int end = min(first + COMPACT_ITEMS, span);
        for (int t = first; t < end; ++t, ++q) {
            if (q >= next) {   // past row r: the next row, or a search when empty rows lie between
                ++r;
                if (Cp[r + 1] <= q) r = row_of_entry(Cp, q, r, r_end);
                start = Cp[r];
                next = Cp[r + 1];
                src = csum[Ap[r]];
            }
            s_src[t] = src + (q - start);
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < span; t += blockDim.x) {
        const long long s = s_src[t];
        Cj[q0 + t] = Uj[s];
        Cx[q0 + t] = Ux[s];
    }
}

template __global__ void compact_entries<float>(const int*, const long long*, const long long*, const int*,
                                                const float*, int, long long, int*, float*);
template __global__ void compact_entries<double>(const int*, const long long*, const long long*, const int*,
                                                 const double*, int, long long, int*, double*);
template __global__ void compact_ranges<float>(const int*, const long long*, const long long*, const int*,
                                               const float*, int, int*, float*);
template __global__ void compact_ranges<double>(const int*, const long long*, const long long*, const int*,
                                                const double*, int, int*, double*);
template __global__ void compact_rows<float>(const int*, const long long*, const long long*, const int*,
                                             const float*, int, int*, float*, const int*, int);
template __global__ void compact_rows<double>(const int*, const long long*, const long long*, const int*,
                                              const double*, int, int*, double*, const int*, int);
