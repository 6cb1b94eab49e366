// The split over n's finish, shared by tsm2.cu's register kernels and tsm2_tc.cu's tensor-core
// kernel: the last of a row tile's S blocks sums the tile's S slices in slice order into C.
#ifndef MATPLAN_TSGEMM_SPLIT_FINISH_CUH
#define MATPLAN_TSGEMM_SPLIT_FINISH_CUH

// The rows of tile blockIdx.x (tile_rows a tile, clamped to m) of the
// S slices at ws (mk = m * k elements apart) summed into Cf by the last of the tile's blocks. Every
// thread of the block calls it.
// Not inlined, its sum loop not unrolled, its indexes 32-bit: inlined, it moved the kernels'
// register counts (row kernel, float, 256 threads, k = 4: 64 -> 84) and an H200 ran the unsplit
// row kernel 9% slower (16384 x 16384 float32, k = 1).
template <typename T>
__device__ __noinline__ void split_finish(const T* ws, long long mk, int k, int tile_rows, long long m,
                                          T* __restrict__ Cf, long long fr, long long fc, unsigned* tickets) {
    const unsigned S = gridDim.y;
    __threadfence();                                   // this block's partials before its ticket
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) last = atomicAdd(tickets + blockIdx.x, 1u) == S - 1;
    if (!__syncthreads_or(last)) return;               // no shared flag: kernels at 48 KB have no room
    __threadfence();
    const long long r_lo = (long long)blockIdx.x * tile_rows;
    const int rows = (int)(r_lo + tile_rows < m ? tile_rows : m - r_lo);  // 32-bit indexes suffice
    for (int q = threadIdx.x; q < rows * k; q += blockDim.x) {
        const int r = q / k, c = q - r * k;
        const T* w = ws + (r_lo + r) * k + c;
        T s = __ldcg(w);                               // L2: the other blocks' writes
#pragma unroll 1
        for (unsigned t = 1; t < S; ++t) s += __ldcg(w + t * mk);
        Cf[(r_lo + r) * fr + c * fc] = s;
    }
    if (threadIdx.x == 0) tickets[blockIdx.x] = 0u;
}

#endif
