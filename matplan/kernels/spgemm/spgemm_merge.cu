// Row-row SpGEMM by the segmented merge (SEEDS section 3): row i of C is the merge of the rows
// B[j, :] scaled by a_ij. Expand every product into a key (column << 32 | product index) and its
// value, sort each row's keys with the segmented merge of sptrans/merge.cu (spt_sort: merge-path tiles,
// then binary-tree rounds over the rows that cross tiles; fixed work a thread whatever the row
// lengths), then compress each row's runs of equal columns. spgemm_merge.py launches them:
//   merge_rows   : seg[i] = the first product of row i (int32: products < 2^31), and the longest
//                  row's products into spt_sort's control word (it bounds the rounds)
//   merge_expand : keys and values of every product, 32 nonzeros of A a warp (their products are
//                  one contiguous run of the output: coalesced writes, no lane idle on short rows)
//   spt_sort     : (sptrans/merge.cu) each row's keys sorted, columns and values written out
//   merge_starts : head[seg[i]] = 1 for every non-empty row (head zeroed by the host)
//   merge_heads  : head[p] |= the sorted column changes at p, a thread a product; the host's
//                  inclusive scan of head gives each run its place in C
//   merge_write  : a thread a product: a run's head sums the run in product order (deterministic:
//                  the keys order a column's products by index) and writes it at its place; C's
//                  indptr from the scan at the rows' starts
// A thread a product, not a warp a row: rows of 10^5 products left one warp looping (skewed:
// 6.9 ms for 4M products).
#define FULL_MASK 0xffffffffu
typedef unsigned long long u64;

// seg[i] = csum[Ap[i]] for i <= m; *maxlen = max over rows of seg[i + 1] - seg[i] (zeroed).
extern "C" __global__ void merge_rows(const int* __restrict__ Ap, const long long* __restrict__ csum,
                                      const int m, int* __restrict__ seg, int* maxlen) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i <= m;
         i += (long long)gridDim.x * blockDim.x) {
        const long long first = csum[Ap[i]];
        seg[i] = (int)first;
        if (i < m) atomicMax(maxlen, (int)(csum[Ap[i + 1]] - first));
    }
}

// keys[p] = (column << 32 | p), vals[p] = a * b for product p = csum[e] + q of A's nonzero e and
// the q-th nonzero of B's row Aj[e]. A warp takes nonzeros e0 .. e0 + 31: lane l holds e0 + l's
// B row and its exclusive product offset in the run; each product finds its nonzero by a binary
// search over the lanes' offsets (shuffles).
template <typename T>
__global__ void merge_expand(const int* __restrict__ Aj, const T* __restrict__ Ax, const long long nnz,
                             const int* __restrict__ Bp, const int* __restrict__ Bj, const T* __restrict__ Bx,
                             const long long* __restrict__ csum, u64* __restrict__ keys, T* __restrict__ vals) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x / 32);
    for (long long e0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32 * 32; e0 < nnz; e0 += 32 * warps) {
        const long long e = e0 + lane;
        int len = 0, b0 = 0;
        T a = T(0);
        if (e < nnz) {
            const int j = Aj[e];
            b0 = Bp[j];
            len = Bp[j + 1] - b0;
            a = Ax[e];
        }
        int inc = len;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int v = __shfl_up_sync(FULL_MASK, inc, d);
            if (lane >= d) inc += v;
        }
        const int total = __shfl_sync(FULL_MASK, inc, 31), exc = inc - len;
        const long long run0 = csum[e0];   // the run's first product
        const int bq = b0 - exc;           // B index of run product q of this lane's nonzero: bq + q
        for (int q0 = 0; q0 < total; q0 += 32) {
            const int q = q0 + lane;
            int t = 0;                     // the last lane with exc <= q
#pragma unroll
            for (int step = 16; step >= 1; step >>= 1)
                if (__shfl_sync(FULL_MASK, exc, t + step) <= q) t += step;
            const int b = __shfl_sync(FULL_MASK, bq, t) + q;
            const T av = __shfl_sync(FULL_MASK, a, t);
            if (q < total) {
                const long long p = run0 + q;
                keys[p] = ((u64)(unsigned)Bj[b] << 32) | (u64)p;
                vals[p] = av * Bx[b];
            }
        }
    }
}

// head[seg[i]] = 1 for the rows i that have products.
extern "C" __global__ void merge_starts(const int* __restrict__ seg, const int m, int* __restrict__ head) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (long long)gridDim.x * blockDim.x)
        if (seg[i] < seg[i + 1]) head[seg[i]] = 1;
}

// head[p] |= the sorted column changes at p (p heads a run of equal columns within its row).
extern "C" __global__ void merge_heads(const int* __restrict__ col, const int n, int* __restrict__ head) {
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x + 1; p < n; p += (long long)gridDim.x * blockDim.x)
        if (col[p] != col[p - 1]) head[p] = 1;
}

// rank: the inclusive scan of the heads (rank[p] - 1 is p's run's place in C). A head sums its run
// (the products up to the next head) in product order; Cp[i] = the runs before row i's start.
template <typename T>
__global__ void merge_write(const int* __restrict__ seg, const int m, const int n, const int* __restrict__ col,
                            const T* __restrict__ val, const int* __restrict__ rank, long long* __restrict__ Cp,
                            int* __restrict__ Cp32, int* __restrict__ Cj, T* __restrict__ Cx) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += stride) {
        const int r = rank[p];
        if (p > 0 && rank[p - 1] == r) continue;   // not a head
        T s = val[p];
        for (long long x = p + 1; x < n && rank[x] == r; ++x) s += val[x];
        Cj[r - 1] = col[p];
        Cx[r - 1] = s;
    }
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i <= m; i += stride) {
        const int s0 = seg[i];
        const int before = s0 > 0 ? rank[s0 - 1] : 0;   // seg[m] == n: every run
        Cp[i] = before;
        Cp32[i] = before;
    }
}

template __global__ void merge_expand<float>(const int*, const float*, long long, const int*, const int*,
                                             const float*, const long long*, u64*, float*);
template __global__ void merge_expand<double>(const int*, const double*, long long, const int*, const int*,
                                              const double*, const long long*, u64*, double*);
template __global__ void merge_write<float>(const int*, int, int, const int*, const float*, const int*, long long*,
                                            int*, int*, float*);
template __global__ void merge_write<double>(const int*, int, int, const int*, const double*, const int*, long long*,
                                             int*, int*, double*);
