// SpTRANS (CSR -> CSR of A^T) with the segmented merge of SEEDS section 3.
// Launched by sptrans.py in this order; tests/test_sptrans.py holds a NumPy port of every kernel.
//   count_rank   : column counts (atomics, warp-aggregated) and each nonzero's rank in its column
//   (cupy.cumsum of the counts -> indptr of A^T)
//   scatter_keys : key (row << 32 | e) of nonzero e to slot indptr[col] + rank (order inside a
//                  column is the atomics' order: arbitrary)
//   tile_sort    : merge-path tiles of D steps over (column ends, slots); each block sorts its slots
//                  by (column, key) with thread-local sorts and log2(BLOCK) merge-path rounds in
//                  shared memory; columns inside the tile are final, the others become sorted runs
//   cross_merge  : the block of the tile holding a crossing column's start merges its runs in
//                  binary-tree rounds (merge path, CHUNK outputs per thread per step)
// Keys (row << 32 | e) order a column by row and, for duplicates, by position in A: stable.

#define SPT_BLOCK 256
#define SPT_ITEMS 8
#define SPT_TILE (SPT_BLOCK * SPT_ITEMS)
#define SPT_MERGE_BLOCK 512
#define SPT_CHUNK 8
#define SPT_SENTINEL_COL 0x7fffffff

typedef unsigned long long u64;

// Merrill & Garland merge-path search: a = ends[0..a_len) (non-decreasing), b = 0, 1, 2, ...
// Returns how many of a come before the diagonal-th step (a[i] <= b[j] takes a first).
__device__ __forceinline__ long long path_search(const int* __restrict__ ends, long long a_len,
                                                long long b_len, long long diag) {
    long long lo = diag - b_len > 0 ? diag - b_len : 0;
    long long hi = diag < a_len ? diag : a_len;
    while (lo < hi) {
        long long mid = (lo + hi) >> 1;
        if ((long long)ends[mid] <= diag - 1 - mid) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

extern "C" __global__ void count_rank(const int* __restrict__ indices, long long nnz, int n,
                                      int* __restrict__ counts, int* __restrict__ rank,
                                      int* __restrict__ bad) {
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    bool live = e < nnz;
    int col = live ? indices[e] : -1;
    if (live && (col < 0 || col >= n)) { atomicExch(bad, 1); col = -1; live = false; }
    unsigned active = __ballot_sync(0xffffffffu, live);
    if (!live) return;
    // lanes of one column take consecutive ranks with one atomic (in lane order)
    unsigned peers = __match_any_sync(active, col);
    int lane = threadIdx.x & 31;
    int leader = __ffs(peers) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(&counts[col + 1], __popc(peers));
    base = __shfl_sync(peers, base, leader);
    rank[e] = base + __popc(peers & ((1u << lane) - 1u));
}

extern "C" __global__ void scatter_keys(const int* __restrict__ a_indptr, const int* __restrict__ indices,
                                        int m, long long nnz, const int* __restrict__ t_indptr,
                                        const int* __restrict__ rank, int n, u64* __restrict__ keys) {
    long long total = (long long)m + nnz;
    long long d = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * SPT_ITEMS;
    if (d >= total) return;
    long long x = path_search(a_indptr + 1, m, nnz, d);
    long long y = d - x;
    for (int k = 0; k < SPT_ITEMS && x + y < total; ++k) {
        if (y < nnz && x < m && (long long)a_indptr[x + 1] > y) {
            int col = indices[y];
            if (col >= 0 && col < n)
                keys[(long long)t_indptr[col] + rank[y]] = ((u64)x << 32) | (u64)y;
            ++y;
        } else {
            ++x;
        }
    }
}

struct Rec { int col; u64 key; };

__device__ __forceinline__ bool rec_less(const Rec& a, const Rec& b) {
    return a.col < b.col || (a.col == b.col && a.key < b.key);
}

template <typename T>
__device__ __forceinline__ void write_final(long long slot, u64 key, const T* __restrict__ data,
                                            int* __restrict__ out_idx, T* __restrict__ out_val) {
    out_idx[slot] = (int)(key >> 32);
    out_val[slot] = data[key & 0xffffffffull];
}

template <typename T>
__global__ void tile_sort(const int* __restrict__ t_indptr, int n, long long nnz,
                          const u64* __restrict__ keys_in, const T* __restrict__ data,
                          u64* __restrict__ runs, int* __restrict__ out_idx, T* __restrict__ out_val) {
    __shared__ int s_col[SPT_TILE];
    __shared__ u64 s_key[SPT_TILE];
    const long long total = (long long)n + nnz;
    const long long t0 = (long long)blockIdx.x * SPT_TILE;
    const long long t1 = t0 + SPT_TILE < total ? t0 + SPT_TILE : total;
    const long long j0 = t0 - path_search(t_indptr + 1, n, nnz, t0);
    const long long j1 = t1 - path_search(t_indptr + 1, n, nnz, t1);
    const int tid = threadIdx.x;

    // this thread's ITEMS steps of the path: slots give records, column ends give sentinels
    Rec r[SPT_ITEMS];
    long long d = t0 + (long long)tid * SPT_ITEMS;
    long long x = d < total ? path_search(t_indptr + 1, n, nnz, d) : n;
    long long y = d < total ? d - x : nnz;
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        r[k].col = SPT_SENTINEL_COL;
        r[k].key = ~0ull;
        if (d + k < t1) {
            if (y < nnz && (x >= n || (long long)t_indptr[x + 1] > y)) {
                if (x < n) {  // else an orphan slot (an out-of-range index was skipped): sentinel
                    r[k].col = (int)x;
                    r[k].key = keys_in[y];
                }
                ++y;
            } else {
                ++x;
            }
        }
    }
    // thread-local sort: odd-even transposition (the leaves of the merge tree)
#pragma unroll
    for (int pass = 0; pass < SPT_ITEMS; ++pass) {
#pragma unroll
        for (int k = pass & 1; k + 1 < SPT_ITEMS; k += 2) {
            if (rec_less(r[k + 1], r[k])) { Rec tmp = r[k]; r[k] = r[k + 1]; r[k + 1] = tmp; }
        }
    }
    // binary-tree merge rounds in shared memory, SPT_ITEMS outputs per thread per round
    const int start = tid * SPT_ITEMS;
    for (int w = SPT_ITEMS; w < SPT_TILE; w *= 2) {
#pragma unroll
        for (int k = 0; k < SPT_ITEMS; ++k) { s_col[start + k] = r[k].col; s_key[start + k] = r[k].key; }
        __syncthreads();
        const int a0 = (start / (2 * w)) * (2 * w);
        const int b0 = a0 + w;
        const int diag = start - a0;
        int lo = diag - w > 0 ? diag - w : 0;
        int hi = diag < w ? diag : w;
        while (lo < hi) {  // stable: a[i] <= b[j] takes a
            int mid = (lo + hi) >> 1;
            Rec ra = {s_col[a0 + mid], s_key[a0 + mid]};
            Rec rb = {s_col[b0 + diag - 1 - mid], s_key[b0 + diag - 1 - mid]};
            if (!rec_less(rb, ra)) lo = mid + 1;
            else hi = mid;
        }
        int ia = a0 + lo, ib = b0 + diag - lo;
        const int a1 = b0, b1 = b0 + w;
#pragma unroll
        for (int k = 0; k < SPT_ITEMS; ++k) {
            bool take_a;
            if (ib >= b1) take_a = true;
            else if (ia >= a1) take_a = false;
            else {
                Rec ra = {s_col[ia], s_key[ia]};
                Rec rb = {s_col[ib], s_key[ib]};
                take_a = !rec_less(rb, ra);
            }
            if (take_a) { r[k].col = s_col[ia]; r[k].key = s_key[ia]; ++ia; }
            else { r[k].col = s_col[ib]; r[k].key = s_key[ib]; ++ib; }
        }
        __syncthreads();
    }
    // record q of the sorted tile is slot j0 + q (columns keep their slot order)
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        long long q = start + k;
        if (q < j1 - j0) {
            long long slot = j0 + q;
            int c = r[k].col;
            if (c == SPT_SENTINEL_COL) continue;
            if ((long long)t_indptr[c] >= j0 && (long long)t_indptr[c + 1] <= j1)
                write_final(slot, r[k].key, data, out_idx, out_val);
            else
                runs[slot] = r[k].key;
        }
    }
}

template <typename T>
__global__ void cross_merge(const int* __restrict__ t_indptr, int n, long long nnz,
                            u64* __restrict__ runs, u64* __restrict__ scratch,
                            const T* __restrict__ data, int* __restrict__ out_idx, T* __restrict__ out_val) {
    const long long total = (long long)n + nnz;
    const long long t0 = (long long)blockIdx.x * SPT_TILE;
    const long long t1 = t0 + SPT_TILE < total ? t0 + SPT_TILE : total;
    const long long j0 = t0 - path_search(t_indptr + 1, n, nnz, t0);
    const long long i = path_search(t_indptr + 1, n, nnz, t1);
    const long long b = t1 - i;
    if (i >= n) return;
    const long long start = t_indptr[i], end = t_indptr[i + 1];
    if (!(start < b && b < end && start >= j0)) return;  // no crossing column owned by this tile
    // runs: [start, b), then SPT_TILE slots each (tiles inside the column), the last one shorter
    const long long q = 1 + (end - b + SPT_TILE - 1) / SPT_TILE;
    const u64* src = runs;
    u64* dst = scratch;
    for (long long s = 1; s < q; s *= 2) {
        const bool final = 2 * s >= q;
        for (long long p0 = start + (long long)threadIdx.x * SPT_CHUNK; p0 < end;
             p0 += (long long)SPT_MERGE_BLOCK * SPT_CHUNK) {
            const long long pend = p0 + SPT_CHUNK < end ? p0 + SPT_CHUNK : end;
            long long p = p0;
            while (p < pend) {
                const long long k0 = p < b ? 0 : 1 + (p - b) / SPT_TILE;
                const long long ra = (k0 / (2 * s)) * (2 * s);
                const long long rm = ra + s < q ? ra + s : q;
                const long long rb = ra + 2 * s < q ? ra + 2 * s : q;
#define SPT_BND(k) ((k) == 0 ? start : ((k) >= q ? end : (b + ((k) - 1) * SPT_TILE < end ? b + ((k) - 1) * SPT_TILE : end)))
                const long long ps = SPT_BND(ra), pm = SPT_BND(rm), pe = SPT_BND(rb);
#undef SPT_BND
                const long long sub = pend < pe ? pend : pe;
                const long long diag = p - ps, alen = pm - ps, blen = pe - pm;
                long long lo = diag - blen > 0 ? diag - blen : 0;
                long long hi = diag < alen ? diag : alen;
                while (lo < hi) {
                    long long mid = (lo + hi) >> 1;
                    if (src[ps + mid] <= src[pm + diag - 1 - mid]) lo = mid + 1;
                    else hi = mid;
                }
                long long ia = ps + lo, ib = pm + diag - lo;
                for (long long out = p; out < sub; ++out) {
                    u64 key;
                    if (ib >= pe || (ia < pm && src[ia] <= src[ib])) key = src[ia++];
                    else key = src[ib++];
                    if (final) write_final(out, key, data, out_idx, out_val);
                    else dst[out] = key;
                }
                p = sub;
            }
        }
        __syncthreads();
        const u64* next = dst;
        dst = (u64*)src;
        src = next;
    }
}

template __global__ void tile_sort<float>(const int*, int, long long, const u64*, const float*, u64*, int*, float*);
template __global__ void tile_sort<double>(const int*, int, long long, const u64*, const double*, u64*, int*, double*);
template __global__ void cross_merge<float>(const int*, int, long long, u64*, u64*, const float*, int*, float*);
template __global__ void cross_merge<double>(const int*, int, long long, u64*, u64*, const double*, int*, double*);
