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

#include "common.cuh"
#include "segmented.cuh"

#ifndef RDX_ITEMS
#define RDX_ITEMS 8                         // keys a thread: tiles of RDX_TILE keys (compiled.py RADIX_TILE)
#endif
#define RDX_TILE (SPT_BLOCK * RDX_ITEMS)
#ifndef RDX_LOOKBACK
#define RDX_LOOKBACK 4                      // look-back words loaded at once
#endif

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
