// Column counts and A^T's indptr: the first two launches of the segsort (segsort.cu),
// sptrans.transpose(method="segsort").
//   spt_count      : per-block shared-memory hash aggregation of column counts (one global atomic
//                    per distinct column of a 2048-entry chunk instead of one per entry: hot
//                    columns no longer serialise thousands of atomics on one word), into the
//                    zeroed workspace; each entry's rank in its column (arbitrary order)
//   spt_scan       : single-pass scan (decoupled look-back) of the counts into A^T's indptr (an
//                    allocation of its own, not zeroed), and the columns binned by length: ids of
//                    medium ones (short_max < L <= warp_max) to the front of seg_list, of long ones
//                    (warp_max < L <= cap) to its back, of huge ones (L > warp_max and L > cap)
//                    to huge_list
// tests/sptrans_reference.py ports each kernel (segsort_* functions).

#include "common.cuh"
#include "segmented.cuh"

#define SEG_CNT_BLOCK 256
#define SEG_CNT_ITEMS 8
#define SEG_CNT_CHUNK (SEG_CNT_BLOCK * SEG_CNT_ITEMS)
#define SEG_CNT_HASH_BITS 11
#define SEG_CNT_HASH (1 << SEG_CNT_HASH_BITS)
#define SEG_CNT_PROBES 4
#define SEG_SCAN_TILE (SPT_BLOCK * SPT_ITEMS)

// Also each entry's rank in its column, to rank[].
extern "C" __global__ void __launch_bounds__(SEG_CNT_BLOCK)
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
                        loc[k] = atomicAdd(&s_cnt[hh], 1);
                        break;
                    }
                }
                if (slot[k] == -1) loc[k] = atomicAdd(&counts[col + 1], 1);   // table crowded
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < SEG_CNT_HASH; i += SEG_CNT_BLOCK) {   // one atomic per column
        const int c = s_col[i];
        if (c < 0) continue;
        s_cnt[i] = atomicAdd(&counts[c + 1], s_cnt[i]);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < SEG_CNT_ITEMS; ++k) {
        if (slot[k] == -2) continue;
        rank[e0 + (long long)k * SEG_CNT_BLOCK] = slot[k] >= 0 ? s_cnt[slot[k]] + loc[k] : loc[k];
    }
}

// Decoupled look-back (Merrill & Garland) by a whole block: the exclusive prefix of tile `tile`
// whose own sum is `total`, returned to every thread of the block (all must call it).
// status[t] (zeroed by the host): 0 not published, sum << 2 | 1 (tile t's own sum), or
// prefix << 2 | 2 (the inclusive prefix through tile t). Tiles are numbered in start order (a
// ticket), so every predecessor has started and publishes its sum without waiting: no deadlock.
// Each thread reads one predecessor a round, blockDim.x of them per dependent round trip, back to
// the nearest inclusive prefix (spt_scan's thread 0 walked back one tile a load: Poisson's 129
// tiles took 12.7 us under Nsight Compute, 10.1 us so on an H100).
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
// prefix), read back by the whole block. At least 5 blocks an SM: 40 registers, no spills (58
// without the bound).
extern "C" __global__ void __launch_bounds__(SPT_BLOCK, 5)
spt_scan(const int* __restrict__ counts, int* __restrict__ indptr, int n, u64* status, int* ctrl, int* seg_list,
         int* huge_list, int short_max, int warp_max, int cap, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ int s_warp[SPT_BLOCK / 32];
    __shared__ int s_tile, s_base[3];
    if (threadIdx.x == 0) s_tile = atomicAdd(ctrl + SEG_TILE_CTR, 1);   // tiles in start order
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
    __syncthreads();
    int run = prefix + excl;
    int med = s_base[0] + (bin_excl & 0xffff), lng = s_base[1] + (bin_excl >> 16), hg = s_base[2] + huge_excl;
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        const long long i = i0 + k;
        if (i < len) {
            run += v[k];
            indptr[i] = run;
            if (i >= 1) {
                if (v[k] > warp_max && v[k] > cap) huge_list[hg++] = (int)(i - 1);
                else if (v[k] > warp_max) seg_list[n - 1 - lng++] = (int)(i - 1);
                else if (v[k] > short_max) seg_list[med++] = (int)(i - 1);
            }
        }
    }
}
