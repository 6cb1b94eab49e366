// Radix SpTRANS (sptrans.transpose(method="radix")): a stable LSD counting sort of A's entries by
// column, so each row of A^T comes out in A's order (by row, then position) with no per-row sort:
// its cost does not depend on how long the rows of A^T are (the segsort's hub columns of R-MAT,
// wordnet or gene_go took 0.3-0.6 ms of bitonic sorts and merge rounds). No column counts: A^T's
// indptr is read off the sorted columns at the end. Launches:
//   spt_digits     : each pass's digit histogram over the valid entries (one read of A's indices,
//                    shared-memory counts of each thread's runs of one digit, no per-column
//                    atomics), the valid entries' count, the bad-index flag, and the row of each
//                    tile's first entry (the first pass's rows)
//   spt_radix_pass : one launch a digit, least significant first (ceil(log2 n / 8) passes of at
//                    most 8 bits): a block stably ranks a tile of RDX_TILE keys by digit and places
//                    them at (digit's global start) + (the digit's count in earlier tiles, by
//                    decoupled look-back, one status word per tile and digit) + (rank in tile),
//                    staged in shared memory by digit so a warp writes consecutive slots.
//                    Keys between passes: int2 (column, row), or, where the column's and the row's
//                    bits fit 31 (rowbits > 0), one int column << rowbits | row (the full column:
//                    the last pass writes it for spt_bounds).
//                    The first pass reads A's indices (key e = position in A), the last writes
//                    A^T's indices (rows) and values at the final slots and the sorted columns.
//   spt_bounds     : A^T's indptr from the sorted columns: position p owns the columns between the
//                    column before it and its own (each column once; long runs of empty columns
//                    filled by the whole block)
// Stable ranking in a tile: warp w takes keys [32 w RDX_ITEMS, 32 (w + 1) RDX_ITEMS) of the tile in
// RDX_ITEMS steps of 32 consecutive keys; a key's rank is its warp's running count of its digit (shared, per warp) plus
// the lanes before it with the same digit (__match_any_sync); the warps' counts are then made
// exclusive over warps. Status words: count << 2 | flag (1: the tile's own count, 2: inclusive
// prefix), 32 bits, so nnz < 2^30 (the host checks).
// tests/sptrans_reference.py ports each kernel (radix_* functions).

#include "common.cuh"
#include "segmented.cuh"

#ifndef RDX_ITEMS
#define RDX_ITEMS 8                         // keys a thread: tiles of RDX_TILE keys (compiled.py RADIX_TILE)
#endif
#define RDX_TILE (SPT_BLOCK * RDX_ITEMS)
#ifndef RDX_LOOKBACK
#define RDX_LOOKBACK 4                      // look-back words loaded at once
#endif

// Inclusive max over the block of one int per thread, exclusive: the largest v of the threads
// before this one (INT_MIN for thread 0).
__device__ __forceinline__ int block_exclusive_max(int v, int* s_warp) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x = max(x, y);
    }
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    int before = (int)0x80000000;
    for (int q = 0; q < warp; ++q) before = max(before, s_warp[q]);
    const int up = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane > 0) before = max(before, up);
    __syncthreads();                                      // s_warp reusable on return
    return before;
}

// hist[p * RDX_BINS + d] (+)= valid entries (column in [0, n)) whose pass-p digit
// ((column >> p * bits) & (2^bits - 1)) is d, for p < passes; ctrl[SEG_N_LIVE] (+)= valid entries;
// ctrl[SEG_BAD] = 1 where an index is outside [0, n); tile_rows[t] = the row of A holding entry
// t * tile for each of the passes' tiles (tile: RDX_TILE keys), tile_rows[tiles] that of entry
// nnz - 1 (the first pass's rows). Entries in chunks of SPT_TILE a block, grid-stride, SPT_ITEMS
// consecutive ones a thread: a run of one digit among them is added once (a row's columns share
// their high digits). __match_any_sync a digit instead took 15-83 us (H100, 0.7-3.9M entries).
extern "C" __global__ void __launch_bounds__(SPT_BLOCK)
spt_digits(const int* __restrict__ a_indptr, int m, const int* __restrict__ indices, long long nnz, int n,
           int passes, int bits, int* hist, int* ctrl, int* __restrict__ tile_rows, int tile,
           const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ int s_hist[RDX_MAX_PASSES * RDX_BINS];
    for (int i = threadIdx.x; i < passes * RDX_BINS; i += SPT_BLOCK) s_hist[i] = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int mask = (1 << bits) - 1;
    int live = 0;
    for (long long base = (long long)blockIdx.x * SPT_TILE; base < nnz; base += (long long)gridDim.x * SPT_TILE) {
        const long long e0 = base + (long long)threadIdx.x * SPT_ITEMS;
        int col[SPT_ITEMS];
#pragma unroll
        for (int k = 0; k < SPT_ITEMS; ++k) col[k] = e0 + k < nnz ? indices[e0 + k] : -1;   // loads first
#pragma unroll
        for (int k = 0; k < SPT_ITEMS; ++k) {
            const bool ok = col[k] >= 0 && col[k] < n;
            if (e0 + k < nnz && !ok) ctrl[SEG_BAD] = 1;
            if (!ok) col[k] = -1;
            live += ok;
        }
        for (int p = 0; p < passes; ++p) {
            int cur = -1, cnt = 0;
#pragma unroll
            for (int k = 0; k < SPT_ITEMS; ++k) {
                const int d = col[k] >= 0 ? (col[k] >> (p * bits)) & mask : -1;
                if (d != cur) {
                    if (cnt) atomicAdd(&s_hist[p * RDX_BINS + cur], cnt);
                    cur = d;
                    cnt = 0;
                }
                cnt += d >= 0;
            }
            if (cnt) atomicAdd(&s_hist[p * RDX_BINS + cur], cnt);
        }
    }
    live = __reduce_add_sync(0xffffffffu, live);
    if (lane == 0 && live) atomicAdd(ctrl + SEG_N_LIVE, live);
    // the tiles' first rows (a thread a row, each row its tiles' starts), and after them the row
    // of the last entry
    for (long long r = (long long)blockIdx.x * SPT_BLOCK + threadIdx.x; r < m; r += (long long)gridDim.x * SPT_BLOCK) {
        const long long lo = a_indptr[r], hi = a_indptr[r + 1];
        for (long long t = (lo + tile - 1) / tile; t * tile < hi; ++t) tile_rows[t] = (int)r;
        if (hi == nnz && hi > lo) tile_rows[(nnz + tile - 1) / tile] = (int)r;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < passes * RDX_BINS; i += SPT_BLOCK)
        if (s_hist[i]) atomicAdd(&hist[i], s_hist[i]);
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
               int* __restrict__ out_cols, const int* __restrict__ tile_rows, int rowbits,
               const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ int s_wcnt[SPT_BLOCK / 32][RDX_BINS];   // per warp and digit: running count, then start
    __shared__ int s_base[RDX_BINS], s_tstart[RDX_BINS];
    __shared__ int2 s_keys[RDX_TILE];                  // the tile's keys by digit (coalesced writes);
    __shared__ T s_vals[RDX_TILE];                     // first pass: the rows of the tile's entries
    __shared__ int s_warp[SPT_BLOCK / 32];
    __shared__ int s_tile;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int mask = (1 << bits) - 1;
    for (int i = threadIdx.x; i < (SPT_BLOCK / 32) * RDX_BINS; i += SPT_BLOCK) (&s_wcnt[0][0])[i] = 0;
    if (threadIdx.x == 0) s_tile = atomicAdd(ticket, 1);   // tiles in start order: no deadlock
    __syncthreads();
    const int tile = s_tile;
    const long long t0 = (long long)tile * RDX_TILE;
    int* s_row = reinterpret_cast<int*>(s_keys);       // first pass: row of entry t0 + q at q
    if (first_col) {   // A's rows of the tile's entries, rows tile_rows[tile] .. tile_rows[tile + 1]:
        // each nonempty row marks its first slot in the tile, a block max-scan carries it forward
        // (a thread filling its row's slots one by one held a tile inside a long row ~2048 stores)
        const int r0 = tile_rows[tile], r1 = tile_rows[tile + 1];
        for (int q = threadIdx.x; q < RDX_TILE; q += SPT_BLOCK) s_row[q] = -1;
        __syncthreads();
        for (int r = r0 + threadIdx.x; r <= r1; r += SPT_BLOCK) {
            const long long lo = a_indptr[r], hi = a_indptr[r + 1];
            if (hi > lo && hi > t0 && lo < t0 + RDX_TILE) s_row[(lo > t0 ? lo : t0) - t0] = r;
        }
        __syncthreads();
        int v[RDX_ITEMS], run = -1;
#pragma unroll
        for (int k = 0; k < RDX_ITEMS; ++k) {
            v[k] = s_row[threadIdx.x * RDX_ITEMS + k];
            run = max(run, v[k]);
            v[k] = run;
        }
        const int before = block_exclusive_max(run, s_warp);
#pragma unroll
        for (int k = 0; k < RDX_ITEMS; ++k) s_row[threadIdx.x * RDX_ITEMS + k] = max(before, v[k]);
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
            } else if (rowbits) {   // packed: column << rowbits | row
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
            // (benchmarks/sptrans_radix_variants.py), GPU time: 80 registers, 16 words
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
            if (rowbits) reinterpret_cast<int*>(out_keys)[pos] = (key.x << rowbits) | key.y;
            else out_keys[pos] = key;
            out_vals[pos] = s_vals[i];
        } else {
            out_idx[pos] = key.y;
            out_val[pos] = s_vals[i];
            out_cols[pos] = key.x;   // sorted: spt_bounds reads A^T's indptr off them
        }
    }
}

template __global__ void spt_radix_pass<float>(const int*, int, const int*, const float*, const int2*,
                                               const float*, long long, const int*, int, int, int, const int*,
                                               unsigned*, int*, int2*, float*, int*, float*, int*, const int*, int,
                                               const unsigned*);
template __global__ void spt_radix_pass<double>(const int*, int, const int*, const double*, const int2*,
                                                const double*, long long, const int*, int, int, int, const int*,
                                                unsigned*, int*, int2*, double*, int*, double*, int*, const int*, int,
                                                const unsigned*);

// A^T's indptr[0..n] from sorted_cols[0..live) (the valid entries' columns in A^T's order, live =
// *n_live): indptr[j] = the entries of columns below j, so position p in [0, live] writes p for
// the columns in (sorted_cols[p - 1], sorted_cols[p]] (-1 before the first, n after the last):
// every column once. A position with more than SPT_BND_RUN such columns (empty columns of a wide
// A) leaves them to its whole block, coalesced.
#define SPT_BND_RUN 32
extern "C" __global__ void __launch_bounds__(SPT_BLOCK)
spt_bounds(const int* __restrict__ sorted_cols, const int* __restrict__ n_live, int n, int* __restrict__ indptr,
           const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ int s_runs;
    __shared__ int s_lo[SPT_TILE], s_hi[SPT_TILE], s_at[SPT_TILE];   // runs: columns lo..hi get at
    const long long live = *n_live;
    const long long p0 = (long long)blockIdx.x * SPT_TILE;
    if (p0 > live) return;                                   // block-uniform
    if (threadIdx.x == 0) s_runs = 0;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        const long long p = p0 + threadIdx.x + (long long)k * SPT_BLOCK;
        if (p > live) continue;
        const int lo = p > 0 ? sorted_cols[p - 1] : -1, hi = p < live ? sorted_cols[p] : n;
        if (hi - lo <= SPT_BND_RUN) {
            for (int j = lo + 1; j <= hi; ++j) indptr[j] = (int)p;
        } else {
            const int r = atomicAdd(&s_runs, 1);
            s_lo[r] = lo + 1;
            s_hi[r] = hi;
            s_at[r] = (int)p;
        }
    }
    __syncthreads();
    const int runs = s_runs;
    for (int r = 0; r < runs; ++r) {   // block-uniform
        const int lo = s_lo[r], hi = s_hi[r], at = s_at[r];
        for (int j = lo + threadIdx.x; j <= hi; j += SPT_BLOCK) indptr[j] = at;
    }
}
