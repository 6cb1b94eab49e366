// SpTRANS device code shared by its .cu files: the block's size and items a thread, the u64 keys,
// merge-path search, the block-wide scan, and the write of a sorted key's column and value.
#ifndef SPTRANS_COMMON_CUH
#define SPTRANS_COMMON_CUH

#define SPT_BLOCK 256
#define SPT_ITEMS 8
#define SPT_TILE (SPT_BLOCK * SPT_ITEMS)

typedef unsigned long long u64;

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

// A sorted key (row << 32 | e) to slot: A^T's column index (the row of A) and value data[e].
template <typename T>
__device__ __forceinline__ void write_final(long long slot, u64 key, const T* __restrict__ data,
                                            int* __restrict__ out_idx, T* __restrict__ out_val) {
    out_idx[slot] = (int)(key >> 32);
    out_val[slot] = data[key & 0xffffffffull];
}

#endif  // SPTRANS_COMMON_CUH
