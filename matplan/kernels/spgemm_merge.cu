// Row-row SpGEMM by the segmented merge (SEEDS section 3): row i of C is the merge of the rows
// B[j, :] scaled by a_ij. The products are expanded in place, row i's at its offset, as q_i sorted
// sub-segments (the rows of B its q_i nonzeros select; B's rows sorted first where they are not),
// then merged pairwise in rounds (sub-segments of 1, 2, 4, ... nonzeros of A into 2, 4, 8, ...),
// each round a fixed number of outputs a thread over all products, a merge-path search into its
// pair, until every row is one sorted run; then each run of equal columns is summed in product
// order. spgemm_merge.py launches them:
//   merge_rows   : seg[i] = the first product of row i (int32: products < 2^31); stats: the
//                  products, the most nonzeros in a row of A (the rounds), whether a row of B
//                  is unsorted (merge_check_b)
//   merge_rowof  : rowof[e] = the row of A's nonzero e
//   merge_expand : columns and values of every product, 32 nonzeros of A a warp (their products
//                  are one contiguous run: coalesced writes, no lane idle on short rows)
//   merge_round  : one round, MERGE_ITEMS outputs a thread (ties to the earlier sub-segment, so a
//                  column's products stay in product order)
//   merge_starts : head[seg[i]] = 1 for every non-empty row (head zeroed by the host)
//   merge_heads  : head[p] |= the sorted column changes at p, a thread a product; the host's
//                  inclusive scan of head gives each run its place in C
//   merge_write  : a thread a product: a run's head sums the run in product order (deterministic)
//                  and writes it at its place; C's indptr from the scan at the rows' starts
// A thread a product, not a warp a row, wherever rows may be long: rows of 10^5 products left one
// warp looping (skewed: 6.9 ms for 4M products at c8d7ebb).
#define FULL_MASK 0xffffffffu
#define MERGE_ITEMS 8

// seg[i] = csum[Ap[i]] for i <= m; stats[0] = the products (csum[Ap[m]]), stats[1] = max over rows
// of A of their nonzeros (stats zeroed).
extern "C" __global__ void merge_rows(const int* __restrict__ Ap, const long long* __restrict__ csum,
                                      const int m, int* __restrict__ seg, unsigned long long* stats) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i <= m;
         i += (long long)gridDim.x * blockDim.x) {
        const long long first = csum[Ap[i]];
        seg[i] = (int)first;
        if (i < m) atomicMax(stats + 1, (unsigned long long)(Ap[i + 1] - Ap[i]));
        else stats[0] = (unsigned long long)first;
    }
}

// stats[2] = 1 when a row of B has a column index above the next one (its rows must be sorted).
extern "C" __global__ void merge_check_b(const int* __restrict__ Bp, const int* __restrict__ Bj, const int n,
                                         unsigned long long* stats) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        for (int q = Bp[i] + 1; q < Bp[i + 1]; ++q)
            if (Bj[q - 1] > Bj[q]) { stats[2] = 1; break; }
}

// rowof[e] = i for A's nonzeros e of row i.
extern "C" __global__ void merge_rowof(const int* __restrict__ Ap, const int m, int* __restrict__ rowof) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (long long)gridDim.x * blockDim.x)
        for (int e = Ap[i]; e < Ap[i + 1]; ++e) rowof[e] = (int)i;
}

// cols[p], vals[p] = column and a * b of product p = csum[e] + q of A's nonzero e and the q-th
// nonzero of B's row Aj[e]. A warp takes nonzeros e0 .. e0 + 31: lane l holds e0 + l's B row and
// its exclusive product offset in the run; each product finds its nonzero by a binary search over
// the lanes' offsets (shuffles).
template <typename T>
__global__ void merge_expand(const int* __restrict__ Aj, const T* __restrict__ Ax, const long long nnz,
                             const int* __restrict__ Bp, const int* __restrict__ Bj, const T* __restrict__ Bx,
                             const long long* __restrict__ csum, int* __restrict__ cols, T* __restrict__ vals) {
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
                cols[p] = Bj[b];
                vals[p] = av * Bx[b];
            }
        }
    }
}

// Round r: sub-segments of 2^r nonzeros of A (their products' ranges, sorted) merged in pairs into
// (dc, dv). Thread t takes outputs [8 t, 8 t + 8): the nonzero of A holding an output (a binary
// search over csum), its row, the pair around it, a merge-path search for the output's diagonal,
// then a plain merge to the end of its outputs or of the pair (and again for the next pair).
template <typename T>
__global__ void merge_round(const long long* __restrict__ csum, const int* __restrict__ Ap,
                            const int* __restrict__ rowof, const long long nnz, const long long P, const int r,
                            const int* __restrict__ sc, const T* __restrict__ sv, int* __restrict__ dc,
                            T* __restrict__ dv) {
    const long long w = 1LL << r;
    const long long stride = (long long)gridDim.x * blockDim.x * MERGE_ITEMS;
    for (long long o0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * MERGE_ITEMS; o0 < P; o0 += stride) {
        const long long oend = o0 + MERGE_ITEMS < P ? o0 + MERGE_ITEMS : P;
        long long o = o0;
        while (o < oend) {
            long long lo = 0, hi = nnz;   // csum[lo] <= o < csum[hi]: e = lo holds o
            while (hi - lo > 1) {
                const long long mid = (lo + hi) >> 1;
                if (csum[mid] <= o) lo = mid; else hi = mid;
            }
            const int row = rowof[lo];
            const long long a0 = Ap[row], a1 = Ap[row + 1];
            const long long ps = a0 + (lo - a0) / (2 * w) * (2 * w);
            const long long pm = ps + w < a1 ? ps + w : a1, pe = ps + 2 * w < a1 ? ps + 2 * w : a1;
            const long long s0 = csum[ps], sm = csum[pm], s1 = csum[pe];
            const long long stop = oend < s1 ? oend : s1;
            if (sm >= s1 || s0 >= sm) {   // one sub-segment (or an empty one): a copy
                for (; o < stop; ++o) { dc[o] = sc[o]; dv[o] = sv[o]; }
                continue;
            }
            const long long diag = o - s0, alen = sm - s0, blen = s1 - sm;
            long long x = diag - blen > 0 ? diag - blen : 0, y = diag < alen ? diag : alen;
            while (x < y) {   // how many of the first sub-segment come before the diagonal (ties: it first)
                const long long mid = (x + y) >> 1;
                if (sc[s0 + mid] <= sc[sm + diag - 1 - mid]) x = mid + 1; else y = mid;
            }
            long long ia = s0 + x, ib = sm + diag - x;
            for (; o < stop; ++o) {
                if (ib >= s1 || (ia < sm && sc[ia] <= sc[ib])) { dc[o] = sc[ia]; dv[o] = sv[ia]; ++ia; }
                else { dc[o] = sc[ib]; dv[o] = sv[ib]; ++ib; }
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
                                             const float*, const long long*, int*, float*);
template __global__ void merge_expand<double>(const int*, const double*, long long, const int*, const int*,
                                              const double*, const long long*, int*, double*);
template __global__ void merge_round<float>(const long long*, const int*, const int*, long long, long long, int,
                                            const int*, const float*, int*, float*);
template __global__ void merge_round<double>(const long long*, const int*, const int*, long long, long long, int,
                                             const int*, const double*, int*, double*);
template __global__ void merge_write<float>(const int*, int, int, const int*, const float*, const int*, long long*,
                                            int*, int*, float*);
template __global__ void merge_write<double>(const int*, int, int, const int*, const double*, const int*, long long*,
                                             int*, int*, double*);
