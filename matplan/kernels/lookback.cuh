// Shared by the .cu files that include it (nvcc resolves the #include beside the file; the
// loader, _cuda.source, pastes it in for NVRTC so CuPy's compile cache sees its text).
#ifndef MATPLAN_LOOKBACK_CUH
#define MATPLAN_LOOKBACK_CUH

// Decoupled look-back (Merrill & Garland) by a whole block: the exclusive prefix of tile `tile`
// whose own sum is `total`, returned to every thread of the block (all must call it).
// status[t] (zeroed by the host): 0 not published, sum << 2 | 1 (tile t's own sum), or
// prefix << 2 | 2 (the inclusive prefix through tile t). Tiles must be numbered in start order
// (a ticket), so every predecessor has started and publishes its sum without waiting: no
// deadlock. Each thread reads one predecessor a round, blockDim.x per dependent round trip: when
// a whole wave of tiles publishes its sums at once, a walk back a warp (32) at a time to the
// nearest inclusive prefix took up to a wave / 32 round trips (Poisson's product scan: 792
// resident tiles, ~25 rounds).
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

#endif  // MATPLAN_LOOKBACK_CUH
