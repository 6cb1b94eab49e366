// Grid-wide barrier for cooperative launches (every block resident), shared by the kernels that
// run several phases in one launch (statistics.cu, sptrans/merge.cu).
#pragma once

// Cooperative groups' algorithm: block 0 adds 2^31 - (grid - 1), the others 1; the top bit of
// *bar flips once all blocks arrived. *bar starts at 0 and is reused across barriers.
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
