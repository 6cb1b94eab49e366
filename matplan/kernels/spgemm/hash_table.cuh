// The shared-memory hash tables of column keys (open addressing, linear probing): hash_shared.cu
// and the bitmap branch of numeric_shared.
#ifndef MATPLAN_SPGEMM_HASH_TABLE_CUH
#define MATPLAN_SPGEMM_HASH_TABLE_CUH

#include "hash_common.cuh"

// Insert key k into table keys[0..S) (S a power of two). Returns the slot, or -1 when the table is full.
// Counts a newly claimed slot in *fresh.
// The first slot is Fibonacci hashing (the top log2(S) bits of k * 2^32/phi), not k mod S:
// columns of stencil rows step by powers of two (i +- 64, i +- 4096), which k mod S piles onto one
// probe chain. H100 numeric pass, mod -> Fibonacci: Poisson 1020 -> 441 us, block-dense 9.9 ->
// 3.6 ms; banded 638 -> 936 us (scattered slots: bank conflicts in the value atomics). Folding
// the key's chunks by XOR, tried to keep bands in order, lost more: Poisson 791 us, block-dense
// 13.1 ms, skewed's symbolic pass 13.6 -> 32.8 ms (benchmarks/spgemm_phases.py).
__device__ __forceinline__ int hash_home(int S, int k) {
    return (int)(((unsigned)k * 0x9E3779B1u) >> (33 - __ffs(S))) & (S - 1);
}

__device__ __forceinline__ int hash_insert(int* keys, int S, int k, int* fresh) {
    int h = hash_home(S, k);
    for (int probe = 0; probe < S; ++probe) {
        int cur = keys[h];
        if (cur == k) return h;
        if (cur == EMPTY_KEY) {
            int old = atomicCAS(&keys[h], EMPTY_KEY, k);
            if (old == EMPTY_KEY) { ++*fresh; return h; }
            if (old == k) return h;
        }
        h = (h + 1) & (S - 1);
    }
    return -1;
}

// The slot of key k, which the table holds (no bound on the probes: the caller knows it is there).
__device__ __forceinline__ int hash_find(const int* keys, int S, int k) {
    int h = hash_home(S, k);
    while (keys[h] != k) h = (h + 1) & (S - 1);
    return h;
}

#endif  // MATPLAN_SPGEMM_HASH_TABLE_CUH
