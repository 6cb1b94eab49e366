// SpTRANS (CSR -> CSR of A^T). Two methods: the segment sort (default; its kernels are at the end of
// this file, after the line of '=') and, first, the segmented merge of SEEDS section 3 (kept as
// sptrans.transpose(method="merge"): its cost does not depend on the longest row of A^T), in two cooperative
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

#define SPT_BLOCK 256
#define SPT_ITEMS 8
#define SPT_TILE (SPT_BLOCK * SPT_ITEMS)
#define SPT_SENTINEL_COL 0x7fffffff
// control words (ctrl = ws + ctrl_off, zeroed by the host): barrier, bad-index flag, longest column
#define SPT_BAR 0
#define SPT_BAD 1
#define SPT_MAXLEN 2

typedef unsigned long long u64;

// Grid barrier of cooperative groups' algorithm (the launch is cooperative, so all blocks are
// resident): block 0 adds 2^31 - (grid - 1), the others 1; the top bit flips once all arrived.
__device__ __forceinline__ void grid_sync(unsigned int* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int nb = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        __threadfence();
        const unsigned int old = atomicAdd(bar, nb);
        while (((old ^ *(volatile unsigned int*)bar) & 0x80000000u) == 0) __nanosleep(20);
        __threadfence();
    }
    __syncthreads();
}

// Merrill & Garland merge-path search: a = ends[0..a_len) (non-decreasing), b = 0, 1, 2, ...
// Returns how many of a come before the diagonal-th step (a[i] <= b[j] takes a first).
__device__ __forceinline__ long long path_search(const int* ends, long long a_len, long long b_len,
                                                long long diag) {
    long long lo = diag - b_len > 0 ? diag - b_len : 0;
    long long hi = diag < a_len ? diag : a_len;
    while (lo < hi) {
        long long mid = (lo + hi) >> 1;
        if ((long long)ends[mid] <= diag - 1 - mid) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Exclusive scan of one int per thread over the block; *total gets the block's sum.
__device__ __forceinline__ int block_exclusive_scan(int v, int* s_warp, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < SPT_BLOCK / 32 ? s_warp[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < SPT_BLOCK / 32) s_warp[lane] = w;   // inclusive warp prefixes
    }
    __syncthreads();
    const int before = warp == 0 ? 0 : s_warp[warp - 1];
    *total = s_warp[SPT_BLOCK / 32 - 1];
    __syncthreads();                                      // s_warp reusable on return
    return before + x - v;
}

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

template <typename T>
__device__ __forceinline__ void write_final(long long slot, u64 key, const T* __restrict__ data,
                                            int* __restrict__ out_idx, T* __restrict__ out_val) {
    out_idx[slot] = (int)(key >> 32);
    out_val[slot] = data[key & 0xffffffffull];
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

// ================================================================================================
// Segment-sort SpTRANS (the default path, sptrans.transpose(method="segsort")): six plain launches,
// no grid barrier. tests/sptrans_reference.py ports each kernel (segsort_* functions).
//   spt_count      : per-block shared-memory hash aggregation of column counts (one global atomic
//                    per distinct column of a 2048-entry chunk instead of one per entry: hot
//                    columns no longer serialise thousands of atomics on one word), into the
//                    zeroed workspace; each entry's rank in its column (arbitrary order)
//   spt_scan       : single-pass scan (decoupled look-back) of the counts into A^T's indptr (an
//                    allocation of its own, not zeroed); columns binned by length: ids of medium
//                    ones (short_max < L <= warp_max) to the front of seg_list, of long ones
//                    (warp_max < L <= cap) to its back, of huge ones (L > warp_max and L > cap)
//                    to huge_list
//   spt_scatter    : as phase 2 above (merge path over A's rows; key (row << 32 | e) to its slot)
//   spt_sort_short : a thread per column of L <= short_max (all columns are scanned, no list): the
//                    warp stages its 32 columns' slots in shared memory (coalesced), each lane
//                    insertion-sorts its column there, the warp writes the outputs (coalesced)
//   spt_sort_big   : a warp per medium column (bitonic in shared memory, skipped when the keys are
//                    already in order), then a block per long
//                    column (bitonic in shared memory, up to `cap` keys), then the fallback's first
//                    step: the huge columns' chunks of cap keys, work items over all blocks, each
//                    sorted in shared memory back into keys
//   spt_merge_long : the fallback's second step: a block per huge column, merge-path rounds between
//                    two global buffers, the last round writing the outputs
// Keys are unique (e is), so any correct sort gives the one stable order: no stability needed.

#define SEG_CNT_BLOCK 256
#define SEG_CNT_ITEMS 8
#define SEG_CNT_CHUNK (SEG_CNT_BLOCK * SEG_CNT_ITEMS)
#define SEG_CNT_HASH_BITS 11
#define SEG_CNT_HASH (1 << SEG_CNT_HASH_BITS)
#define SEG_CNT_PROBES 4
#define SEG_SCAN_TILE (SPT_BLOCK * SPT_ITEMS)
#define SEG_SHORT_BLOCK 128
#define SEG_SHORT_STAGE 1024     // keys a warp stages (32 columns of <= 32 keys)
#ifndef SEG_SHORT_BATCH
#define SEG_SHORT_BATCH 4        // slots a lane loads at once in spt_sort_short's staging and output
#endif
#define SEG_BIG_BLOCK 256
#define SEG_WARP_KEYS 512        // most keys of a warp-sorted column (warp_max <= this)
#define SEG_BLOCK_KEYS 4096      // most keys a block sorts in shared memory (cap <= this)
#define SEG_SENTINEL_KEY 0xffffffffffffffffull
// control words (ctrl, zeroed by the host)
#define SEG_BAD 0
#define SEG_TILE_CTR 1
#define SEG_N_MED 2
#define SEG_N_LONG 3
#define SEG_N_HUGE 4
#define SEG_N_LIVE 5      // A^T's indptr[n] (the valid entries), for the radix passes
#define SEG_MERGE_BLOCK 512
// radix method: digits of at most 8 bits (RDX_BINS values), at most 4 passes (31-bit columns)
#define RDX_BINS 256
#define RDX_MAX_PASSES 4
#ifndef RDX_ITEMS
#define RDX_ITEMS 8                         // keys a thread: tiles of RDX_TILE keys (sptrans.RADIX_TILE)
#endif
#define RDX_TILE (SPT_BLOCK * RDX_ITEMS)
#ifndef RDX_LOOKBACK
#define RDX_LOOKBACK 4                      // look-back words loaded at once
#endif

// RANKS (the segsort): also each entry's rank in its column, to rank[]; without (the radix method,
// rank unused) every atomic is a reduction whose old value nobody waits for.
template <bool RANKS>
__global__ void __launch_bounds__(SEG_CNT_BLOCK)
spt_count(const int* __restrict__ indices, long long nnz, int n, int* counts, int* rank, int* ctrl, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ int s_col[SEG_CNT_HASH];
    __shared__ int s_cnt[SEG_CNT_HASH];
    for (int i = threadIdx.x; i < SEG_CNT_HASH; i += SEG_CNT_BLOCK) { s_col[i] = -1; s_cnt[i] = 0; }
    __syncthreads();
    const long long e0 = (long long)blockIdx.x * SEG_CNT_CHUNK + threadIdx.x;
    int slot[SEG_CNT_ITEMS], loc[SEG_CNT_ITEMS];   // slot -2: no entry, -1: counted by a global atomic
#pragma unroll
    for (int k = 0; k < SEG_CNT_ITEMS; ++k) {
        const long long e = e0 + (long long)k * SEG_CNT_BLOCK;
        slot[k] = -2;
        loc[k] = 0;
        if (e < nnz) {
            const int col = indices[e];
            if (col < 0 || col >= n) {
                ctrl[SEG_BAD] = 1;
            } else {
                const unsigned h = ((unsigned)col * 2654435761u) >> (32 - SEG_CNT_HASH_BITS);
                slot[k] = -1;
                for (int p = 0; p < SEG_CNT_PROBES; ++p) {
                    const int hh = (int)((h + p) & (SEG_CNT_HASH - 1));
                    const int prev = atomicCAS(&s_col[hh], -1, col);
                    if (prev == -1 || prev == col) {
                        slot[k] = hh;
                        if (RANKS) loc[k] = atomicAdd(&s_cnt[hh], 1);
                        else atomicAdd(&s_cnt[hh], 1);
                        break;
                    }
                }
                if (slot[k] == -1) {   // table crowded
                    if (RANKS) loc[k] = atomicAdd(&counts[col + 1], 1);
                    else atomicAdd(&counts[col + 1], 1);
                }
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < SEG_CNT_HASH; i += SEG_CNT_BLOCK) {   // one atomic per column
        const int c = s_col[i];
        if (c < 0) continue;
        if (RANKS) s_cnt[i] = atomicAdd(&counts[c + 1], s_cnt[i]);
        else atomicAdd(&counts[c + 1], s_cnt[i]);
    }
    if (RANKS) {
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SEG_CNT_ITEMS; ++k) {
            if (slot[k] == -2) continue;
            rank[e0 + (long long)k * SEG_CNT_BLOCK] = slot[k] >= 0 ? s_cnt[slot[k]] + loc[k] : loc[k];
        }
    }
}

template __global__ void spt_count<true>(const int*, long long, int, int*, int*, int*, const unsigned*);
template __global__ void spt_count<false>(const int*, long long, int, int*, int*, int*, const unsigned*);

// Decoupled look-back (Merrill & Garland) by a whole block: the exclusive prefix of tile `tile`
// whose own sum is `total`, returned to every thread of the block (all must call it).
// status[t] (zeroed by the host): 0 not published, sum << 2 | 1 (tile t's own sum), or
// prefix << 2 | 2 (the inclusive prefix through tile t). Tiles are numbered in start order (a
// ticket), so every predecessor has started and publishes its sum without waiting: no deadlock.
// Each thread reads one predecessor a round, blockDim.x of them per dependent round trip, back to
// the nearest inclusive prefix (spt_scan's thread 0 walked back one tile a load: Poisson's 129
// tiles took 12.7 us under Nsight Compute, 10.1 us so; H100, 2026-11-24).
__device__ __forceinline__ long long lookback_prefix(unsigned long long* status, const int tile,
                                                     const long long total) {
    __shared__ int s_stop;
    __shared__ long long s_sum[32];
    volatile unsigned long long* st = status;
    if (tile == 0) {
        if (threadIdx.x == 0) st[0] = ((unsigned long long)total << 2) | 2ULL;
        return 0;
    }
    if (threadIdx.x == 0) st[tile] = ((unsigned long long)total << 2) | 1ULL;
    const int nt = (int)blockDim.x, t = (int)threadIdx.x;
    long long before = 0;
    for (int top = tile - 1;; top -= nt) {
        const int q = top - t;                                  // thread t: the (t + 1)-th nearest
        unsigned long long w = q >= 0 ? st[q] : 2ULL;           // before tile 0: prefix 0
        while ((w & 3ULL) == 0) w = st[q];
        if (t == 0) s_stop = nt;
        __syncthreads();
        if ((w & 3ULL) == 2ULL) atomicMin(&s_stop, t);          // the nearest inclusive prefix
        __syncthreads();
        const int stop = s_stop;
        long long part = t <= stop ? (long long)(w >> 2) : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
        if ((t & 31) == 0) s_sum[t >> 5] = part;
        __syncthreads();
        for (int k = 0; k < (nt + 31) >> 5; ++k) before += s_sum[k];
        if (stop < nt) break;                                   // the same in every thread
    }
    if (threadIdx.x == 0) st[tile] = ((unsigned long long)(before + total) << 2) | 2ULL;
    return before;
}

// counts[0..n] (counts[0] == 0, counts[1 + j] = count of column j) -> their inclusive prefix sums
// in indptr[0..n] (A^T's indptr: its own allocation, which needs no zeroing). status:
// one zeroed word a tile (lookback_prefix's: value << 2 | flag, 1: the tile's sum, 2: inclusive
// prefix), read back by the whole block. ctrl[SEG_N_LIVE] also gets indptr[n] (the radix passes
// read it there: a replayed graph's passes then name no output array, SpTrans.runner).
// hist (radix method; null: none): hist[p * RDX_BINS + d] (+)= entries of the columns whose pass-p
// digit ((j >> p * bits) & (2^bits - 1)) is d, for p < passes: per column, not per entry.
extern "C" __global__ void __launch_bounds__(SPT_BLOCK)
spt_scan(const int* __restrict__ counts, int* __restrict__ indptr, int n, u64* status, int* ctrl, int* seg_list,
         int* huge_list, int short_max, int warp_max, int cap, int* hist, int passes, int bits, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ int s_warp[SPT_BLOCK / 32];
    __shared__ int s_tile, s_base[3];
    __shared__ int s_hist[RDX_MAX_PASSES * RDX_BINS];
    if (threadIdx.x == 0) s_tile = atomicAdd(ctrl + SEG_TILE_CTR, 1);   // tiles in start order
    if (hist)
        for (int i = threadIdx.x; i < RDX_MAX_PASSES * RDX_BINS; i += SPT_BLOCK) s_hist[i] = 0;
    __syncthreads();
    const int t = s_tile;
    const long long len = (long long)n + 1;
    const long long i0 = (long long)t * SEG_SCAN_TILE + (long long)threadIdx.x * SPT_ITEMS;
    int v[SPT_ITEMS];
    int sum = 0, bins = 0, huge = 0;              // bins: medium count | long count << 16
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        const long long i = i0 + k;
        v[k] = i < len ? counts[i] : 0;
        sum += v[k];
        if (hist && i >= 1 && i < len && v[k]) {   // radix: column i - 1's entries to its digits
            const int mask = (1 << bits) - 1;
            for (int p = 0; p < passes; ++p) atomicAdd(&s_hist[p * RDX_BINS + (((int)(i - 1) >> (p * bits)) & mask)], v[k]);
        }
        if (i >= 1 && i < len) {
            if (v[k] > warp_max && v[k] > cap) ++huge;
            else if (v[k] > warp_max) bins += 1 << 16;
            else if (v[k] > short_max) bins += 1;
        }
    }
    int total;
    const int excl = block_exclusive_scan(sum, s_warp, &total);
    const int prefix = (int)lookback_prefix(status, t, total);   // every thread: block barriers
    int bin_total, huge_total;
    const int bin_excl = block_exclusive_scan(bins, s_warp, &bin_total);
    const int huge_excl = block_exclusive_scan(huge, s_warp, &huge_total);
    if (threadIdx.x == 0) {
        s_base[0] = (bin_total & 0xffff) ? atomicAdd(ctrl + SEG_N_MED, bin_total & 0xffff) : 0;
        s_base[1] = (bin_total >> 16) ? atomicAdd(ctrl + SEG_N_LONG, bin_total >> 16) : 0;
        s_base[2] = huge_total ? atomicAdd(ctrl + SEG_N_HUGE, huge_total) : 0;
    }
    if (hist)
        for (int i = threadIdx.x; i < passes * RDX_BINS; i += SPT_BLOCK)
            if (s_hist[i]) atomicAdd(&hist[i], s_hist[i]);
    __syncthreads();
    int run = prefix + excl;
    int med = s_base[0] + (bin_excl & 0xffff), lng = s_base[1] + (bin_excl >> 16), hg = s_base[2] + huge_excl;
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        const long long i = i0 + k;
        if (i < len) {
            run += v[k];
            indptr[i] = run;
            if (i == n) ctrl[SEG_N_LIVE] = run;
            if (i >= 1) {
                if (v[k] > warp_max && v[k] > cap) huge_list[hg++] = (int)(i - 1);
                else if (v[k] > warp_max) seg_list[n - 1 - lng++] = (int)(i - 1);
                else if (v[k] > short_max) seg_list[med++] = (int)(i - 1);
            }
        }
    }
}

// phase_scatter's ITEMS path steps a thread, one thread a launch slot: the walk first (which steps
// are entries, their rows), then the entries' loads (indices, rank, then t_indptr) each unrolled so
// the ITEMS random reads are in flight together instead of one dependent chain per entry.
extern "C" __global__ void __launch_bounds__(SPT_BLOCK)
spt_scatter(const int* __restrict__ a_indptr, const int* __restrict__ indices, int m, long long nnz,
            const int* __restrict__ t_indptr, const int* __restrict__ rank, int n, u64* keys, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    const long long total = (long long)m + nnz;
    const long long d = ((long long)blockIdx.x * SPT_BLOCK + threadIdx.x) * SPT_ITEMS;
    if (d >= total) return;
    long long x = path_search(a_indptr + 1, m, nnz, d);
    long long y = d - x;
    const long long y0 = y;
    int row[SPT_ITEMS];
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {   // entries of this thread: y0, y0 + 1, ... (rows row[])
        row[k] = -1;
        if (x + y < total) {
            if (y < nnz && x < m && (long long)a_indptr[x + 1] > y) { row[k] = (int)x; ++y; }
            else ++x;
        }
    }
    const int cnt = (int)(y - y0);
    int col[SPT_ITEMS], r[SPT_ITEMS];
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) col[k] = k < cnt ? indices[y0 + k] : -1;
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) r[k] = (k < cnt && col[k] >= 0 && col[k] < n) ? rank[y0 + k] : 0;
    int rows[SPT_ITEMS];                    // row of the k-th entry (compacted from the walk)
    {
        int j = 0;
#pragma unroll
        for (int k = 0; k < SPT_ITEMS; ++k) rows[k] = 0;
#pragma unroll
        for (int k = 0; k < SPT_ITEMS; ++k) {
            if (row[k] >= 0) {
#pragma unroll
                for (int q = 0; q < SPT_ITEMS; ++q) if (q == j) rows[q] = row[k];   // register-indexed
                ++j;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        if (k < cnt && col[k] >= 0 && col[k] < n)
            keys[(long long)t_indptr[col[k]] + r[k]] = ((u64)rows[k] << 32) | (u64)(y0 + k);
    }
}

__device__ __forceinline__ void insertion_sort(u64* s, int len) {
    for (int i = 1; i < len; ++i) {
        const u64 v = s[i];
        int k = i - 1;
        while (k >= 0 && s[k] > v) { s[k + 1] = s[k]; --k; }
        s[k + 1] = v;
    }
}

// Bitonic sort of s[0..P) (P a power of two) by nt threads (thread t), ascending; WARP: the
// threads are one warp (__syncwarp between stages), else the block (__syncthreads).
template <bool WARP>
__device__ __forceinline__ void bitonic(u64* s, int P, int t, int nt) {
    for (int k = 2; k <= P; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int q = t; q < P / 2; q += nt) {
                const int i = (q / j) * 2 * j + (q & (j - 1));
                const int l = i + j;
                const u64 a = s[i], b = s[l];
                if ((a > b) == ((i & k) == 0)) { s[i] = b; s[l] = a; }
            }
            if (WARP) __syncwarp(); else __syncthreads();
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(SEG_SHORT_BLOCK)
spt_sort_short(const int* __restrict__ t_indptr, int n, u64* keys, const T* __restrict__ data,
               int* __restrict__ out_idx, T* __restrict__ out_val, int short_max, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ u64 s_buf[SEG_SHORT_BLOCK / 32][SEG_SHORT_STAGE];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const long long j0 = (long long)blockIdx.x * SEG_SHORT_BLOCK + w * 32;
    if (j0 >= n) return;                                      // warp-uniform
    const long long jend = j0 + 32 < n ? j0 + 32 : n;
    const long long j = j0 + lane;
    const int lo = t_indptr[j0], hi = t_indptr[jend];
    int s = 0, L = 0;
    if (j < n) { s = t_indptr[j]; L = t_indptr[j + 1] - s; }
    const bool mine = j < n && L <= short_max;
    u64* buf = s_buf[w];
    if (hi - lo <= SEG_SHORT_STAGE) {
        // staging and the output in rounds of SEG_SHORT_BATCH slots a lane, their loads issued
        // together: a loop of one slot a step waited for each load before issuing the next
        for (int p0 = lo + lane; p0 < hi; p0 += 32 * SEG_SHORT_BATCH) {
            u64 k[SEG_SHORT_BATCH];
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u) {
                const int p = p0 + 32 * u;
                k[u] = p < hi ? keys[p] : SEG_SENTINEL_KEY;
            }
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u)
                if (p0 + 32 * u < hi) buf[p0 + 32 * u - lo] = k[u];
        }
        __syncwarp();
        unsigned others = __ballot_sync(0xffffffffu, j < n && !mine);   // medium/long: not ours
        while (others) {
            const int src = __ffs(others) - 1;
            others &= others - 1;
            const int os = __shfl_sync(0xffffffffu, s, src), ol = __shfl_sync(0xffffffffu, L, src);
            for (int k = lane; k < ol; k += 32) buf[os - lo + k] = SEG_SENTINEL_KEY;
        }
        __syncwarp();
        if (mine && L > 1) insertion_sort(buf + (s - lo), L);
        __syncwarp();
        for (int p0 = lo + lane; p0 < hi; p0 += 32 * SEG_SHORT_BATCH) {
            u64 k[SEG_SHORT_BATCH];
            T v[SEG_SHORT_BATCH];
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u) {
                const int p = p0 + 32 * u;
                k[u] = p < hi ? buf[p - lo] : SEG_SENTINEL_KEY;
            }
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u)
                if (k[u] != SEG_SENTINEL_KEY) v[u] = data[k[u] & 0xffffffffull];   // the gathers in flight together
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u) {
                if (k[u] == SEG_SENTINEL_KEY) continue;
                const long long p = p0 + 32 * u;
                out_idx[p] = (int)(k[u] >> 32);
                out_val[p] = v[u];
            }
        }
    } else if (mine) {                                           // a crowded warp: in place
        insertion_sort(keys + s, L);
        for (int k = 0; k < L; ++k) write_final<T>((long long)s + k, keys[s + k], data, out_idx, out_val);
    }
}

// Merge-path rounds over one huge row of A^T (L > cap keys at slots [s, s + L), sorted in chunks of
// cap keys by spt_sort_big) by one block: runs of w = cap, 2 cap, ... merged pairwise between keys
// and scratch, the last round writing the outputs.
template <typename T>
__device__ void merge_rounds(long long s, int L, int cap, u64* keys, u64* scratch,
                             const T* __restrict__ data, int* __restrict__ out_idx, T* __restrict__ out_val) {
    u64* src = keys + s;
    u64* dst = scratch + s;
    for (long long w = cap; w < L; w *= 2) {
        const bool final = 2 * w >= L;
        for (long long p = (long long)threadIdx.x * SPT_ITEMS; p < L; p += (long long)blockDim.x * SPT_ITEMS) {
            const long long a0 = (p / (2 * w)) * (2 * w);
            const long long am = a0 + w < L ? a0 + w : L, ae = a0 + 2 * w < L ? a0 + 2 * w : L;
            const long long diag = p - a0, alen = am - a0, blen = ae - am;
            long long lo = diag - blen > 0 ? diag - blen : 0, hi = diag < alen ? diag : alen;
            while (lo < hi) {
                const long long mid = (lo + hi) >> 1;
                if (src[a0 + mid] <= src[am + diag - 1 - mid]) lo = mid + 1;
                else hi = mid;
            }
            long long ia = a0 + lo, ib = am + diag - lo;
            const long long pend = p + SPT_ITEMS < ae ? p + SPT_ITEMS : ae;
            for (long long out = p; out < pend; ++out) {
                u64 key;
                if (ib >= ae || (ia < am && src[ia] <= src[ib])) key = src[ia++];
                else key = src[ib++];
                if (final) write_final<T>(s + out, key, data, out_idx, out_val);
                else dst[out] = key;
            }
        }
        __syncthreads();
        u64* tmp = src; src = dst; dst = tmp;
    }
}

template <typename T>
__global__ void __launch_bounds__(SEG_MERGE_BLOCK)
spt_merge_long(const int* __restrict__ t_indptr, const int* __restrict__ huge_list, const int* ctrl, u64* keys,
               u64* scratch, const T* __restrict__ data, int* __restrict__ out_idx, T* __restrict__ out_val,
               int cap, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    const int n_huge = ctrl[SEG_N_HUGE];
    for (int i = blockIdx.x; i < n_huge; i += gridDim.x) {   // block-uniform
        const int c = huge_list[i];
        const long long s = t_indptr[c];
        merge_rounds<T>(s, t_indptr[c + 1] - (int)s, cap, keys, scratch, data, out_idx, out_val);
    }
}

template <typename T>
__global__ void __launch_bounds__(SEG_BIG_BLOCK)
spt_sort_big(const int* __restrict__ t_indptr, int n, const int* __restrict__ seg_list,
             const int* __restrict__ huge_list, const int* ctrl, u64* keys, const T* __restrict__ data,
             int* __restrict__ out_idx, T* __restrict__ out_val, int cap, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ u64 s_buf[SEG_BLOCK_KEYS];
    const int n_med = ctrl[SEG_N_MED], n_long = ctrl[SEG_N_LONG], n_huge = ctrl[SEG_N_HUGE];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int warps = SEG_BIG_BLOCK / 32;
    u64* wb = s_buf + w * SEG_WARP_KEYS;
    for (long long i = (long long)blockIdx.x * warps + w; i < n_med; i += (long long)gridDim.x * warps) {
        const int c = seg_list[i];
        const long long s = t_indptr[c];
        const int L = t_indptr[c + 1] - (int)s;
        int P = 32;
        while (P < L) P <<= 1;
        bool ordered = true;
        for (int k = lane; k < P; k += 32) {
            wb[k] = k < L ? keys[s + k] : SEG_SENTINEL_KEY;
            if (k > 0 && k < L && keys[s + k - 1] > keys[s + k]) ordered = false;
        }
        __syncwarp();
        if (!__all_sync(0xffffffffu, ordered)) bitonic<true>(wb, P, lane, 32);   // often in order already
        for (int k = lane; k < L; k += 32) write_final<T>(s + k, wb[k], data, out_idx, out_val);
        __syncwarp();
    }
    __syncthreads();
    for (long long i = blockIdx.x; i < n_long; i += gridDim.x) {   // block-uniform
        const int c = seg_list[n - 1 - i];
        const long long s = t_indptr[c];
        const int L = t_indptr[c + 1] - (int)s;
        int P = 32;
        while (P < L) P <<= 1;
        bool ordered = true;
        for (int k = threadIdx.x; k < P; k += SEG_BIG_BLOCK) {
            s_buf[k] = k < L ? keys[s + k] : SEG_SENTINEL_KEY;
            if (k > 0 && k < L && keys[s + k - 1] > keys[s + k]) ordered = false;
        }
        if (!__syncthreads_and(ordered)) bitonic<false>(s_buf, P, threadIdx.x, SEG_BIG_BLOCK);
        for (int k = threadIdx.x; k < L; k += SEG_BIG_BLOCK) write_final<T>(s + k, s_buf[k], data, out_idx, out_val);
        __syncthreads();
    }
    // huge rows (L > cap): their chunks of cap keys are work items spread over all blocks (item q
    // to block q mod gridDim.x), each sorted in shared memory back into keys; spt_merge_long merges
    long long item = 0;
    for (int i = 0; i < n_huge; ++i) {
        const int c = huge_list[i];
        const long long s = t_indptr[c];
        const int L = t_indptr[c + 1] - (int)s;
        const long long chunks = (L + cap - 1) / cap;
        const long long first = item + ((long long)blockIdx.x - item % gridDim.x + gridDim.x) % gridDim.x;
        for (long long q = first; q < item + chunks; q += gridDim.x) {   // block-uniform
            const long long c0 = (q - item) * cap;
            const int len = L - c0 < cap ? (int)(L - c0) : cap;
            for (int k = threadIdx.x; k < cap; k += SEG_BIG_BLOCK) s_buf[k] = k < len ? keys[s + c0 + k] : SEG_SENTINEL_KEY;
            __syncthreads();
            bitonic<false>(s_buf, cap, threadIdx.x, SEG_BIG_BLOCK);
            for (int k = threadIdx.x; k < len; k += SEG_BIG_BLOCK) keys[s + c0 + k] = s_buf[k];
            __syncthreads();
        }
        item += chunks;
    }
}

template __global__ void spt_sort_short<float>(const int*, int, u64*, const float*, int*, float*, int, const unsigned*);
template __global__ void spt_sort_short<double>(const int*, int, u64*, const double*, int*, double*, int, const unsigned*);
template __global__ void spt_sort_big<float>(const int*, int, const int*, const int*, const int*, u64*,
                                             const float*, int*, float*, int, const unsigned*);
template __global__ void spt_sort_big<double>(const int*, int, const int*, const int*, const int*, u64*,
                                              const double*, int*, double*, int, const unsigned*);
template __global__ void spt_merge_long<float>(const int*, const int*, const int*, u64*, u64*, const float*,
                                               int*, float*, int, const unsigned*);
template __global__ void spt_merge_long<double>(const int*, const int*, const int*, u64*, u64*, const double*,
                                                int*, double*, int, const unsigned*);

// ================================================================================================
// Radix SpTRANS (sptrans.transpose(method="radix")): a stable LSD counting sort of A's entries by
// column, so each row of A^T comes out in A's order (by row, then position) with no per-row sort:
// its cost does not depend on how long the rows of A^T are (the segsort's hub columns of R-MAT,
// wordnet or gene_go took 0.3-0.6 ms of bitonic sorts and merge rounds). Launches:
//   spt_count      : column counts for A^T's indptr (as for the segsort, no ranks), each pass's
//                    digit histogram, and rows_of[e] (the row of entry e: read back at the end)
//   spt_scan       : A^T's indptr (as for the segsort; no column is binned)
//   spt_radix_pass : one launch a digit, least significant first (ceil(log2 n / 8) passes of at
//                    most 8 bits): a block stably ranks a tile of RDX_TILE keys by digit and places
//                    them at (digit's global start) + (the digit's count in earlier tiles, by
//                    decoupled look-back, one status word per tile and digit) + (rank in tile),
//                    staged in shared memory by digit so a warp writes consecutive slots.
//                    Keys between passes: int2 (column, row), or, where the column's bits left
//                    after the first digit and the row's fit 31 bits (rowbits > 0), one int
//                    (column >> bits) << rowbits | row: 4 bytes less an entry each way between
//                    passes. A pass then takes its shift in the dropped column's bits.
//                    The first pass reads A's indices (key e = position in A), the last writes
//                    A^T's indices (rows_of[e]) and values (data[e]) at the final slots.
// Stable ranking in a tile: warp w takes keys [32 w RDX_ITEMS, 32 (w + 1) RDX_ITEMS) of the tile in
// RDX_ITEMS steps of 32 consecutive keys; a key's rank is its warp's running count of its digit (shared, per warp) plus
// the lanes before it with the same digit (__match_any_sync); the warps' counts are then made
// exclusive over warps. Status words: count << 2 | flag (1: the tile's own count, 2: inclusive
// prefix), 32 bits, so nnz < 2^30 (the host checks).
// The row of A holding entry e (the last r with a_indptr[r] <= e), by a whole warp: a 32-way
// search, ~log32(m) dependent loads instead of log2(m) (a thread's binary search over 262k rows
// held every first-pass tile ~18 load latencies).
__device__ __forceinline__ int warp_row_of(const int* __restrict__ a_indptr, int m, long long e) {
    const int lane = threadIdx.x & 31;
    int lo = 0, hi = m - 1;   // a_indptr[lo] <= e throughout; the answer is in [lo, hi]
    while (hi - lo > 31) {
        const int probe = lo + (int)((long long)(hi - lo + 1) * lane / 32);   // strictly increasing, lane 0 at lo
        const unsigned ok = __ballot_sync(0xffffffffu, a_indptr[probe] <= e);  // a prefix of the lanes
        const int last = 31 - __clz(ok);
        const int next = __shfl_sync(0xffffffffu, probe, last < 31 ? last + 1 : 31);
        lo = __shfl_sync(0xffffffffu, probe, last);
        if (last < 31) hi = next - 1;
    }
    const unsigned ok = __ballot_sync(0xffffffffu, lo + lane <= hi && a_indptr[lo + lane] <= e);
    return lo + 31 - __clz(ok);
}

#ifndef RDX_MIN_BLOCKS
#define RDX_MIN_BLOCKS 4                    // __launch_bounds__ minimum blocks an SM: 64 registers
#endif

template <typename T>
__global__ void __launch_bounds__(SPT_BLOCK, RDX_MIN_BLOCKS)
spt_radix_pass(const int* __restrict__ a_indptr, int m, const int* __restrict__ first_col,
               const T* __restrict__ first_val, const int2* __restrict__ in_keys, const T* __restrict__ in_vals,
               long long nnz, const int* __restrict__ n_live, int n, int shift, int bits,
               const int* __restrict__ hist, unsigned* status, int* ticket, int2* __restrict__ out_keys,
               T* __restrict__ out_vals, int* __restrict__ out_idx, T* __restrict__ out_val,
               int rowbits, int drop, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ int s_wcnt[SPT_BLOCK / 32][RDX_BINS];   // per warp and digit: running count, then start
    __shared__ int s_base[RDX_BINS], s_tstart[RDX_BINS];
    __shared__ int2 s_keys[RDX_TILE];                  // the tile's keys by digit (coalesced writes);
    __shared__ T s_vals[RDX_TILE];                     // first pass: the rows of the tile's entries
    __shared__ int s_warp[SPT_BLOCK / 32];
    __shared__ int s_tile, s_rows[2];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int mask = (1 << bits) - 1;
    for (int i = threadIdx.x; i < (SPT_BLOCK / 32) * RDX_BINS; i += SPT_BLOCK) (&s_wcnt[0][0])[i] = 0;
    if (threadIdx.x == 0) s_tile = atomicAdd(ticket, 1);   // tiles in start order: no deadlock
    __syncthreads();
    const int tile = s_tile;
    const long long t0 = (long long)tile * RDX_TILE;
    int* s_row = reinterpret_cast<int*>(s_keys);       // first pass: row of entry t0 + q at q
    if (first_col) {   // A's rows of the tile's entries: a thread a row, between the first and last
        if (w < 2) {   // warps 0 and 1: the rows of the tile's first and last entries
            const int r = warp_row_of(a_indptr, m, w == 0 ? t0 : min(t0 + RDX_TILE, nnz) - 1);
            if (lane == 0) s_rows[w] = r;
        }
        __syncthreads();
        for (int r = s_rows[0] + threadIdx.x; r <= s_rows[1]; r += SPT_BLOCK) {
            const long long lo = max((long long)a_indptr[r], t0), hi = min((long long)a_indptr[r + 1], t0 + RDX_TILE);
            for (long long q = lo; q < hi; ++q) s_row[q - t0] = r;
        }
        __syncthreads();
    }
    // keys of later passes: the valid entries only (first pass: all nnz, invalid columns skipped)
    const long long live = n_live ? (long long)*n_live : nnz;
    const long long i0 = t0 + w * (32 * RDX_ITEMS) + lane;
    int col[RDX_ITEMS], row[RDX_ITEMS], rk[RDX_ITEMS];
    T val[RDX_ITEMS];
#pragma unroll
    for (int k = 0; k < RDX_ITEMS; ++k) {
        const long long i = i0 + k * 32;
        col[k] = -1;
        row[k] = 0;
        val[k] = T(0);
        if (i < live) {
            int2 key;
            if (first_col) {
                key = make_int2(first_col[i], s_row[i - t0]);
            } else if (rowbits) {   // packed: (column >> bits) << rowbits | row
                const int pk = reinterpret_cast<const int*>(in_keys)[i];
                key = make_int2(pk >> rowbits, pk & ((1 << rowbits) - 1));
            } else {
                key = in_keys[i];
            }
            if (key.x >= 0 && key.x < n) {
                col[k] = key.x;
                row[k] = key.y;
                val[k] = first_col ? first_val[i] : in_vals[i];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < RDX_ITEMS; ++k) {
        const int d = col[k] >= 0 ? (col[k] >> shift) & mask : RDX_BINS;   // RDX_BINS: no key
        const unsigned peers = __match_any_sync(0xffffffffu, d);
        const int before = d < RDX_BINS ? s_wcnt[w][d] : 0;
        rk[k] = before + __popc(peers & ((1u << lane) - 1u));
        __syncwarp();
        if (d < RDX_BINS && lane == __ffs(peers) - 1) s_wcnt[w][d] = before + __popc(peers);
        __syncwarp();
    }
    __syncthreads();
    const int d = threadIdx.x;   // SPT_BLOCK == RDX_BINS: a thread a digit from here
    int cnt = 0;
#pragma unroll
    for (int q = 0; q < SPT_BLOCK / 32; ++q) { const int c = s_wcnt[q][d]; s_wcnt[q][d] = cnt; cnt += c; }
    int all, tile_keys;
    const int start = block_exclusive_scan(d <= mask ? hist[d] : 0, s_warp, &all);   // digit's first slot
    const int tstart = block_exclusive_scan(cnt, s_warp, &tile_keys);                 // ... in the tile
    int prefix = 0;
    if (d <= mask) {
        volatile unsigned* st = status;
        if (tile == 0) {
            st[d] = ((unsigned)cnt << 2) | 2u;
        } else {
            st[(long long)tile * RDX_BINS + d] = ((unsigned)cnt << 2) | 1u;
            // walk back RDX_LOOKBACK predecessors a step, their words loaded together. H100 variants
            // (sptrans-radix-variants-h100-2026-11-23.log, 410a237), GPU time: 80 registers, 16 words
            // -> 64 registers (4 blocks an SM), 4 words: Poisson 192 -> 150 us, banded 297 -> 240,
            // dragon 312 -> 258, rmat-scale17 212 -> 187
            for (long long j = tile - 1;;) {
                unsigned v[RDX_LOOKBACK];
#pragma unroll
                for (int q = 0; q < RDX_LOOKBACK; ++q) v[q] = j - q >= 0 ? st[(j - q) * RDX_BINS + d] : 2u;
                int used = RDX_LOOKBACK;   // words summed this step; stop: an inclusive prefix found
                bool stop = false;
#pragma unroll
                for (int q = 0; q < RDX_LOOKBACK; ++q) {
                    if (stop || used < RDX_LOOKBACK) continue;
                    if ((v[q] & 3u) == 0u) { used = q; continue; }   // not published: reload from here
                    prefix += (int)(v[q] >> 2);
                    if ((v[q] & 3u) == 2u) stop = true;
                }
                if (stop) break;
                j -= used;
            }
            st[(long long)tile * RDX_BINS + d] = ((unsigned)(prefix + cnt) << 2) | 2u;
        }
    }
    s_base[d] = start + prefix - tstart;   // global slot of the tile's slot i when i holds digit d
    s_tstart[d] = tstart;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < RDX_ITEMS; ++k) {
        if (col[k] < 0) continue;
        const int dk = (col[k] >> shift) & mask;
        const int slot = s_tstart[dk] + s_wcnt[w][dk] + rk[k];
        s_keys[slot] = make_int2(col[k], row[k]);
        s_vals[slot] = val[k];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < tile_keys; i += SPT_BLOCK) {   // consecutive slots of a digit: coalesced
        const int2 key = s_keys[i];
        const long long pos = (long long)s_base[(key.x >> shift) & mask] + i;
        if (out_keys) {
            if (rowbits) reinterpret_cast<int*>(out_keys)[pos] = ((key.x >> drop) << rowbits) | key.y;
            else out_keys[pos] = key;
            out_vals[pos] = s_vals[i];
        } else {
            out_idx[pos] = key.y;
            out_val[pos] = s_vals[i];
        }
    }
}

template __global__ void spt_radix_pass<float>(const int*, int, const int*, const float*, const int2*,
                                               const float*, long long, const int*, int, int, int, const int*,
                                               unsigned*, int*, int2*, float*, int*, float*, int, int, const unsigned*);
template __global__ void spt_radix_pass<double>(const int*, int, const int*, const double*, const int2*,
                                                const double*, long long, const int*, int, int, int, const int*,
                                                unsigned*, int*, int2*, double*, int*, double*, int, int, const unsigned*);

// ================================================================================================
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
