// SpTRANS (CSR -> CSR of A^T) by the segmented merge of SEEDS section 3 (kept as
// sptrans.transpose(method="merge"): its cost does not depend on the longest row of A^T; the segsort
// and radix methods are in count_scan.cu, segsort.cu and radix.cu), in two cooperative
// launches whose phases are separated by grid barriers instead of kernel boundaries (a launch from
// Python costs more host time than a barrier costs the GPU). tests/sptrans_reference.py holds a
// NumPy port of every phase.
//   spt_place (phases 0-2, light, full occupancy)
//     0 count   : column counts (atomics, warp-aggregated) and each nonzero's rank in its column
//                 (the atomics' order: arbitrary)
//     1 scan    : counts -> indptr of A^T in place (block sums, barrier, block offsets), and the
//                 longest column (it bounds the merge rounds of phase 4)
//     2 scatter : merge-path partition of (A's row ends, nonzeros), ITEMS steps a thread; key
//                 (row << 32 | e) of nonzero e to slot indptr[col] + rank
//   spt_sort<T> (phases 3-4, shared memory)
//     3 tile    : merge-path tiles of TILE steps over (column ends, slots); each block sorts its
//                 slots by (column, key): thread-local sorts, then log2(BLOCK) merge-path rounds in
//                 shared memory (each column a segment). Columns inside a tile are final; a column
//                 crossing tiles leaves one sorted run per tile
//     4 cross   : binary-tree rounds over the crossing columns' runs, grid barrier between rounds;
//                 every block takes whole tiles of output slots (ITEMS outputs a thread, merge path
//                 into the pair of runs): fixed work per thread however long the column
// Keys (row << 32 | e) order a column by row and, for duplicates, by position in A: stable and
// deterministic. Both kernels take [phase_lo, phase_hi) so a profiler can run one phase a launch.

#include "common.cuh"
#include "../grid_sync.cuh"

#define SPT_SENTINEL_COL 0x7fffffff
// control words (ctrl = ws + ctrl_off, zeroed by the host): barrier, bad-index flag, longest column
#define SPT_BAR 0
#define SPT_BAD 1
#define SPT_MAXLEN 2


// phase 0: counts[1 + j] (+)= nonzeros of column j; rank[e] = e's place among them
__device__ __forceinline__ void phase_count(const int* __restrict__ indices, long long nnz, int n,
                                            int* counts, int* rank, int* ctrl) {
    const long long stride = (long long)gridDim.x * SPT_BLOCK;
    const int lane = threadIdx.x & 31;
    for (long long base = (long long)blockIdx.x * SPT_BLOCK; base < nnz; base += stride) {  // block-uniform
        const long long e = base + threadIdx.x;
        bool live = e < nnz;
        int col = live ? indices[e] : -1;
        if (live && (col < 0 || col >= n)) { atomicExch(ctrl + SPT_BAD, 1); live = false; }
        const unsigned active = __ballot_sync(0xffffffffu, live);
        if (live) {  // lanes of one column take consecutive ranks with one atomic (in lane order)
            const unsigned peers = __match_any_sync(active, col);
            const int leader = __ffs(peers) - 1;
            int b = 0;
            if (lane == leader) b = atomicAdd(&counts[col + 1], __popc(peers));
            b = __shfl_sync(peers, b, leader);
            rank[e] = b + __popc(peers & ((1u << lane) - 1u));
        }
    }
}

// phase 1: ws[0..n] (ws[0] == 0, ws[1 + j] = count of column j) -> inclusive prefix sums in place;
// totals[gridDim.x] is scratch; ctrl[SPT_MAXLEN] = the longest column.
__device__ __forceinline__ void phase_scan(int* ws, int n, int* totals, int* ctrl, int* s_warp) {
    const long long len = (long long)n + 1;
    const long long per_block = (len + gridDim.x - 1) / gridDim.x;
    const long long per_thread = (per_block + SPT_BLOCK - 1) / SPT_BLOCK;
    long long b0 = (long long)blockIdx.x * per_block;
    if (b0 > len) b0 = len;
    const long long b1 = b0 + per_block < len ? b0 + per_block : len;
    long long i0 = b0 + threadIdx.x * per_thread;
    if (i0 > b1) i0 = b1;
    const long long i1 = i0 + per_thread < b1 ? i0 + per_thread : b1;
    int sum = 0, mx = 0;
    for (long long i = i0; i < i1; ++i) { const int v = ws[i]; sum += v; mx = v > mx ? v : mx; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { const int y = __shfl_xor_sync(0xffffffffu, mx, o); mx = y > mx ? y : mx; }
    if ((threadIdx.x & 31) == 0 && mx > 0) atomicMax(ctrl + SPT_MAXLEN, mx);
    int block_sum;
    const int excl = block_exclusive_scan(sum, s_warp, &block_sum);
    if (threadIdx.x == 0) totals[blockIdx.x] = block_sum;
    grid_sync((unsigned int*)(ctrl + SPT_BAR));
    int before = 0;
    for (int k = threadIdx.x; k < (int)blockIdx.x; k += SPT_BLOCK) before += totals[k];
    int offset;
    block_exclusive_scan(before, s_warp, &offset);
    int run = offset + excl;
    for (long long i = i0; i < i1; ++i) { run += ws[i]; ws[i] = run; }
}

// phase 2: keys[t_indptr[col] + rank[e]] = (row << 32 | e), ITEMS merge-path steps a thread
__device__ __forceinline__ void phase_scatter(const int* __restrict__ a_indptr, const int* __restrict__ indices,
                                              int m, long long nnz, const int* t_indptr, const int* rank,
                                              int n, u64* keys) {
    const long long total = (long long)m + nnz;
    const long long stride = (long long)gridDim.x * SPT_BLOCK * SPT_ITEMS;
    for (long long d = ((long long)blockIdx.x * SPT_BLOCK + threadIdx.x) * SPT_ITEMS; d < total; d += stride) {
        long long x = path_search(a_indptr + 1, m, nnz, d);
        long long y = d - x;
        for (int k = 0; k < SPT_ITEMS && x + y < total; ++k) {
            if (y < nnz && x < m && (long long)a_indptr[x + 1] > y) {
                const int col = indices[y];
                if (col >= 0 && col < n)
                    keys[(long long)t_indptr[col] + rank[y]] = ((u64)x << 32) | (u64)y;
                ++y;
            } else {
                ++x;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(SPT_BLOCK, 8)
spt_place(const int* __restrict__ a_indptr, const int* __restrict__ indices, int m, int n, long long nnz,
          int* ws, long long totals_off, long long ctrl_off, int* rank, u64* keys, int phase_lo, int phase_hi) {
    __shared__ int s_warp[SPT_BLOCK / 32];
    int* ctrl = ws + ctrl_off;
    for (int ph = phase_lo; ph < phase_hi && ph < 3; ++ph) {
        if (ph > phase_lo) grid_sync((unsigned int*)(ctrl + SPT_BAR));
        if (ph == 0) phase_count(indices, nnz, n, ws, rank, ctrl);
        else if (ph == 1) phase_scan(ws, n, ws + totals_off, ctrl, s_warp);
        else phase_scatter(a_indptr, indices, m, nnz, ws, rank, n, keys);
    }
}

struct Rec { int col; u64 key; };

__device__ __forceinline__ bool rec_less(const Rec& a, const Rec& b) {
    return a.col < b.col || (a.col == b.col && a.key < b.key);
}

// phase 3, one tile: sort its slots by (column, key); final columns to the output, others to runs.
// tile_x[t] = the column at the tile's first step (columns ended before it).
template <typename T>
__device__ __forceinline__ void tile_sort(long long t, const int* t_indptr, int n, long long nnz,
                                          const u64* keys_in, const T* __restrict__ data, u64* runs,
                                          int* __restrict__ out_idx, T* __restrict__ out_val, int* tile_x,
                                          int* s_col, u64* s_key, long long* s_bounds) {
    const long long total = (long long)n + nnz;
    const long long t0 = t * SPT_TILE;
    const long long t1 = t0 + SPT_TILE < total ? t0 + SPT_TILE : total;
    const int tid = threadIdx.x;
    // this thread's ITEMS steps of the path: slots give records, column ends give sentinels
    Rec r[SPT_ITEMS];
    const long long d = t0 + (long long)tid * SPT_ITEMS;
    long long x = d < total ? path_search(t_indptr + 1, n, nnz, d) : n;
    long long y = d < total ? d - x : nnz;
    if (tid == 0) {                   // the tile's first column and slot
        tile_x[t] = (int)x;
        s_bounds[0] = y;
    }
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
    if (d < t1 && d + SPT_ITEMS >= t1) s_bounds[1] = y;   // the thread ending at t1: the tile's slot end
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
    // the tile's slot range [tj0, tj1) (s_bounds written before the rounds' barriers): record q of
    // the sorted tile is slot tj0 + q
    const long long tj0 = s_bounds[0], tj1 = s_bounds[1];
    __syncthreads();                      // s_bounds is rewritten by the block's next tile
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        const long long q = start + k;
        if (q < tj1 - tj0) {
            const long long slot = tj0 + q;
            const int c = r[k].col;
            if (c == SPT_SENTINEL_COL) continue;
            if ((long long)t_indptr[c] >= tj0 && (long long)t_indptr[c + 1] <= tj1)
                write_final(slot, r[k].key, data, out_idx, out_val);
            else
                runs[slot] = r[k].key;
        }
    }
}

// phase 4, one tile in round s (runs merged pairwise: s runs -> 2s runs): the tile's output slots
// [j0, j1) that belong to a crossing column (at most the tile's first and last columns). A crossing
// column c of slots [start, end) has runs [start, b), then TILE slots each from b, where
// b = ((c + start) / TILE + 1) * TILE - c is its first tile boundary (slot y of c is path step c + y).
template <typename T>
__device__ __forceinline__ void cross_tile(long long t, long long s, const int* t_indptr, int n, long long nnz,
                                           const int* tile_x, int tiles, const u64* src, u64* dst,
                                           const T* __restrict__ data, int* __restrict__ out_idx,
                                           T* __restrict__ out_val) {
    const long long total = (long long)n + nnz;
    const long long t0 = t * SPT_TILE;
    const long long t1 = t0 + SPT_TILE < total ? t0 + SPT_TILE : total;
    const int x0 = tile_x[t];
    const int x1 = t + 1 < tiles ? tile_x[t + 1] : n;
    const long long j0 = t0 - x0, j1 = t1 - x1;
    long long p = j0 + (long long)threadIdx.x * SPT_ITEMS;
    const long long pend = p + SPT_ITEMS < j1 ? p + SPT_ITEMS : j1;
    while (p < pend) {
        int c;
        if (x0 < n && p < (long long)t_indptr[x0 + 1]) {
            c = x0;
        } else if (x1 < n && x1 != x0) {
            const long long s1 = t_indptr[x1];
            if (p < s1) { p = s1; continue; }      // columns between x0 and x1 are final
            c = x1;
        } else {
            break;
        }
        const long long start = t_indptr[c], end = t_indptr[c + 1];
        const long long b = ((c + start) / SPT_TILE + 1) * SPT_TILE - c;
        const long long cend = end < pend ? end : pend;
        if (b >= end) { p = cend; continue; }       // final column (inside one tile)
        const long long q = 1 + (end - b + SPT_TILE - 1) / SPT_TILE;
        if (s >= q) { p = cend; continue; }         // merged in an earlier round
        const bool final = 2 * s >= q;
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
            const long long mid = (lo + hi) >> 1;
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

// Phases 3-4. keys: [0, nnz) the scattered keys (phase 2), then the cross rounds' scratch;
// runs: nnz more (phase 3 writes crossing columns' runs there); tile_x: tiles ints.
template <typename T>
__global__ void __launch_bounds__(SPT_BLOCK)
spt_sort(const int* t_indptr, int n, long long nnz, const T* __restrict__ data, u64* keys, u64* runs,
         int* tile_x, int* ctrl, int* __restrict__ out_idx, T* __restrict__ out_val,
         int phase_lo, int phase_hi) {
    __shared__ int s_col[SPT_TILE];
    __shared__ u64 s_key[SPT_TILE];
    __shared__ long long s_bounds[2];
    const long long total = (long long)n + nnz;
    const int tiles = (int)((total + SPT_TILE - 1) / SPT_TILE);
    if (phase_lo <= 3 && 3 < phase_hi) {
        for (long long t = blockIdx.x; t < tiles; t += gridDim.x)
            tile_sort<T>(t, t_indptr, n, nnz, keys, data, runs, out_idx, out_val, tile_x, s_col, s_key, s_bounds);
        if (phase_hi > 4) grid_sync((unsigned int*)(ctrl + SPT_BAR));
    }
    if (phase_lo <= 4 && 4 < phase_hi) {
        // q of a column of L slots is at most 1 + ceil((L - 1) / TILE): the longest bounds the rounds
        const long long maxlen = ctrl[SPT_MAXLEN];
        const long long qmax = maxlen > 1 ? 1 + (maxlen - 1 + SPT_TILE - 1) / SPT_TILE : 1;
        int r = 0;
        for (long long s = 1; s < qmax; s *= 2, ++r) {
            if (r > 0) grid_sync((unsigned int*)(ctrl + SPT_BAR));
            const u64* src = (r & 1) ? keys : runs;
            u64* dst = (r & 1) ? runs : keys;
            for (long long t = blockIdx.x; t < tiles; t += gridDim.x)
                cross_tile<T>(t, s, t_indptr, n, nnz, tile_x, tiles, src, dst, data, out_idx, out_val);
        }
    }
}

template __global__ void spt_sort<float>(const int*, int, long long, const float*, u64*, u64*, int*,
                                         int*, int*, float*, int, int);
template __global__ void spt_sort<double>(const int*, int, long long, const double*, u64*, u64*, int*,
                                          int*, int*, double*, int, int);
