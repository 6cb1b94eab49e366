// Scans: a block-wide exclusive sum, and the single-pass int64 scan of the analysis (scan_products,
// scan_rows in hash_analysis.cu).
#ifndef MATPLAN_SPGEMM_BLOCK_SCAN_CUH
#define MATPLAN_SPGEMM_BLOCK_SCAN_CUH

#include "hash_common.cuh"

// Block-wide exclusive sum of v; returns this thread's offset and sets *total (warp_sums: 33
// shared words). Three block barriers: every thread of the block must call it.
template <typename V>
__device__ __forceinline__ V block_exclusive_sum(const V v, V* warp_sums, V* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    V incl = v;
    for (int off = 1; off < 32; off <<= 1) {
        const V o = __shfl_up_sync(FULL_MASK, incl, off);
        if (lane >= off) incl += o;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const V w = lane < nwarps ? warp_sums[lane] : V(0);
        V wincl = w;
        for (int off = 1; off < 32; off <<= 1) {
            const V o = __shfl_up_sync(FULL_MASK, wincl, off);
            if (lane >= off) wincl += o;
        }
        if (lane < nwarps) warp_sums[lane] = wincl - w;
        if (lane == 31) warp_sums[32] = wincl;
    }
    __syncthreads();
    const V out = warp_sums[warp] + incl - v;
    *total = warp_sums[32];
    __syncthreads();
    return out;
}

// out[0] = 0, out[i + 1] = in[0] + ... + in[i] (int64), optionally also truncated to int32 in out32
// (C's indptr, used when nnz(C) < 2^31). Single pass with decoupled look-back (Merrill & Garland):
// a block scans SCAN_ITEMS * blockDim.x consecutive values, publishes its aggregate (flag 1) and
// then its inclusive prefix (flag 2) in status[1 + b] (value << 2 | flag); its first warp reads
// its predecessors' words 32 at a time back to the nearest inclusive prefix (a thread walking
// back alone took 58 us for 1.8M values). Block ids are taken from a ticket (status[0]) so a block's
// predecessors have all started: no deadlock whatever order the blocks are scheduled in.
// status: 1 + gridDim.x zeroed words. Replaces cupy.cumsum (several launches, ~65 us of host
// time each on the H100 host) on the launch path.
#define SCAN_ITEMS 8
template <typename Load>
__device__ __forceinline__ void scan_i64(const long long n, Load load, long long* __restrict__ out,
                                         int* __restrict__ out32, unsigned long long* status) {
    __shared__ long long s_warp[33];
    __shared__ long long s_prefix;
    __shared__ int s_bid;
    if (threadIdx.x == 0) s_bid = (int)atomicAdd(status, 1ULL);
    __syncthreads();
    const int bid = s_bid, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // warp-striped: warp w of the block takes SCAN_ITEMS * 32 consecutive values, item j of lane
    // l at base + 32 j + l (loads and stores coalesced; the blocked layout, 8 consecutive values a
    // thread, made every warp access touch 32 sectors); v[j]: the inclusive scan within the warp
    const long long base = ((long long)bid * blockDim.x + warp * 32) * SCAN_ITEMS + lane;
    long long v[SCAN_ITEMS], run = 0;
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
        long long x = base + 32 * j < n ? load(base + 32 * j) : 0;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const long long y = __shfl_up_sync(FULL_MASK, x, off);
            if (lane >= off) x += y;
        }
        v[j] = run + x;
        run += __shfl_sync(FULL_MASK, x, 31);
    }
    long long total;   // the warps' offsets within the block: lane 0 carries its warp's sum
    const long long excl = __shfl_sync(FULL_MASK, block_exclusive_sum(lane == 0 ? run : 0LL, s_warp, &total), 0);
    if (warp == 0) {   // look back a warp at a time: lane l reads predecessor bid - 1 - l
        volatile unsigned long long* st = status + 1;
        long long before = 0;
        if (bid == 0) {
            if (lane == 0) st[0] = ((unsigned long long)total << 2) | 2ULL;
        } else {
            if (lane == 0) st[bid] = ((unsigned long long)total << 2) | 1ULL;
            __threadfence();
            for (int top = bid - 1;; top -= 32) {
                const int q = top - lane;
                unsigned long long w = q >= 0 ? st[q] : 2ULL;         // before block 0: prefix 0
                while (__any_sync(FULL_MASK, (w & 3ULL) == 0))      // a predecessor not published yet
                    if ((w & 3ULL) == 0) w = st[q];
                const unsigned found = __ballot_sync(FULL_MASK, (w & 3ULL) == 2);
                const int stop = found ? __ffs(found) - 1 : 31;      // nearest inclusive prefix
                long long part = lane <= stop ? (long long)(w >> 2) : 0;
                for (int off = 16; off > 0; off >>= 1) part += __shfl_down_sync(FULL_MASK, part, off);
                before += __shfl_sync(FULL_MASK, part, 0);
                if (found) break;
            }
            __threadfence();
            if (lane == 0) st[bid] = ((unsigned long long)(before + total) << 2) | 2ULL;
        }
        if (lane == 0) {
            s_prefix = before;
            if (bid == 0) { out[0] = 0; if (out32) out32[0] = 0; }
        }
    }
    __syncthreads();
    const long long before = s_prefix + excl;
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
        const long long e = base + 32 * j;
        if (e < n) {
            out[e + 1] = before + v[j];
            if (out32) out32[e + 1] = (int)(before + v[j]);
        }
    }
}

#endif  // MATPLAN_SPGEMM_BLOCK_SCAN_CUH
