// The hash passes in shared memory (kernels/spgemm/symbolic.py, numeric.py):
// * symbolic_shared: one shared-memory hash table of column keys per row counts the distinct
//   columns (exact nnz of C's row). A table that fills up zeroes the row's count and appends it
//   to a list for symbolic_global (the paper's "invalid row, recomputed in global memory").
// * numeric_shared: keys (atomicCAS) + values (atomicAdd) in shared memory; the table is at least
//   as large as the row's exact nnz, so it never overflows. The row's table is then bitonic-sorted
//   by key (empty keys = INT_MAX sort last) and its first nnz entries written out, or, unsorted,
//   compacted with a shared counter.
#include "hash_common.cuh"
#include "hash_table.cuh"
#include "block_scan.cuh"
#include "bitmaps.cuh"

#define MAX_RPB 32

// Sub-warp rows (W < 32) run in blocks of at most 256 threads (rules.BLOCK_THREADS): their
// kernels are compiled for SUBWARP_MIN_BLOCKS such blocks an SM (a register cap), whole-warp
// rows (up to MAX_TPR = 1024 threads a block) as the compiler likes. H100: 8 (32
// registers) or 6 moved numeric_shared within noise (ncu had occupancy 62.5%, register-bound):
// default 1, no cap (benchmarks/spgemm_phases.py --define SUBWARP_MIN_BLOCKS=N).
#ifndef SUBWARP_MIN_BLOCKS
#define SUBWARP_MIN_BLOCKS 1
#endif
#define SUBWARP_BOUNDS __launch_bounds__(W < 32 ? 256 : 1024, W < 32 ? SUBWARP_MIN_BLOCKS : 1)

// ------------------------------------------------------------------ symbolic, shared memory
// W: lanes of a row's groups, tpr when it is 8 or 16 (launch_shape), else 32.
template <int W>
__global__ void SUBWARP_BOUNDS symbolic_shared(
        const int* __restrict__ Ap, const int* __restrict__ Aj,
        const int* __restrict__ Bp, const int* __restrict__ Bj,
        const long long* __restrict__ csum, const int* __restrict__ rows, const int nrows,
        const int S, const int rpb, long long* __restrict__ row_nnz,
        int* __restrict__ ovf_rows, const int ovf_base, int* __restrict__ ovf_count) {
    __shared__ int counts[MAX_RPB];
    __shared__ int full[MAX_RPB];
    const int tpr = blockDim.x / rpb;
    const int slot = threadIdx.x / tpr, lane = threadIdx.x % tpr;
    int* keys = reinterpret_cast<int*>(smem) + slot * S;
    for (int i = lane; i < S; i += tpr) keys[i] = EMPTY_KEY;
    if (lane == 0) { counts[slot] = 0; full[slot] = 0; }
    __syncthreads();
    const long long r = (long long)blockIdx.x * rpb + slot;
    int row = -1;
    if (r < nrows) {
        row = rows[r];
        // A row is full, and goes to symbolic_global, past 3/4 of its table: linear probing gets
        // slow near a full table (a row of skewed-spgemm that overflowed probed for milliseconds)
        const int limit = S - S / 4;
        for_each_product<W>(Ap, Aj, Bp, Bj, csum, row, lane, tpr,
            [&](int k, int, int) {   // stop once any group of the row has filled the table
                int fresh = 0;
                if (hash_insert(keys, S, k, &fresh) < 0 || (fresh && atomicAdd(&counts[slot], 1) >= limit))
                    full[slot] = 1;
                return *(volatile int*)&full[slot] != 0;
            });
    }
    __syncthreads();
    if (row >= 0 && lane == 0) {
        if (full[slot]) {
            row_nnz[row] = 0;   // symbolic_global adds the row's count
            ovf_rows[ovf_base + atomicAdd(ovf_count, 1)] = row;   // after the rows sent there directly
        } else {
            row_nnz[row] = counts[slot];
        }
    }
}

// ------------------------------------------------------------------ numeric, shared memory
// Tables of up to RANK_SLOTS slots a thread (S <= RANK_SLOTS * tpr; launch_shape gives every
// table up to 2048 slots that; 2 a thread for whole-warp rows, up to 4 for sub-warp rows) and
// RANK_SORT_MAX slots are sorted by rank: each thread takes its slots into registers, the
// occupied keys are compacted to the front of the table, and each key counts the smaller ones
// among the row's c compacted keys (c^2 broadcast reads a row instead of S^2: a row of 64
// nonzeros in a 128-slot table, uniform random, had 16k comparisons). Larger tables use a
// bitonic sort, or, given bm_words > 0 (one row a block; rules.bitmap_words: B's columns fit in
// shared memory beside the table), a bitmap of B's columns: each occupied slot sets its column's
// bit, a block scan of the bit counts over contiguous word ranges (one a thread) gives each range's
// first output position, and each thread walks its range's bits in column order, finds each
// column's slot again (hash_find) and writes it out (write_bits_staged). Its cost is ~k/32 words and nnz probes a row
// instead of the bitonic network's log2(S)(log2(S) + 1)/2 barrier-separated stages over all S slots
// (16384 slots: 105 stages; R-MAT scale 16, H100: the sort was 22.6 of the 35.3 ms of
// numeric_shared).
#define RANK_SORT_MAX 256
#define RANK_SLOTS (W < 32 ? 4 : 2)

template <typename T, int W>
__global__ void SUBWARP_BOUNDS numeric_shared(
        const int* __restrict__ Ap, const int* __restrict__ Aj, const T* __restrict__ Ax,
        const int* __restrict__ Bp, const int* __restrict__ Bj, const T* __restrict__ Bx,
        const long long* __restrict__ csum, const int* __restrict__ rows, const int nrows,
        const int S, const int rpb, const long long* __restrict__ Cp, const long long c_base,
        int* __restrict__ Cj, T* __restrict__ Cx, const int sort, long long* __restrict__ row_nnz,
        const int bm_words, const unsigned long long* __restrict__ skip) {
    if (skip && *skip) return;   // a guessed launch words_differ refuted (guesses._guessed)
    __shared__ int counts[MAX_RPB], distinct[MAX_RPB];
    const int tpr = blockDim.x / rpb;
    const int slot = threadIdx.x / tpr, lane = threadIdx.x % tpr;
    T* vals = reinterpret_cast<T*>(smem) + slot * S;
    int* keys = reinterpret_cast<int*>(reinterpret_cast<T*>(smem) + rpb * S) + slot * S;
    unsigned* bm = reinterpret_cast<unsigned*>(keys + S);   // bm_words > 0: rpb == 1, after the table
    for (int i = lane; i < S; i += tpr) { keys[i] = EMPTY_KEY; vals[i] = T(0); }
    for (int i = threadIdx.x; i < bm_words; i += blockDim.x) bm[i] = 0u;
    if (lane == 0) counts[slot] = distinct[slot] = 0;
    __syncthreads();
    const long long r = (long long)blockIdx.x * rpb + slot;
    int row = -1;
    if (r < nrows) {
        row = rows ? rows[r] : (int)r;
        int fresh = 0;
        for_each_product<W>(Ap, Aj, Bp, Bj, csum, row, lane, tpr,
            [&](int k, int e, int b) {
                const int h = hash_insert(keys, S, k, &fresh);
                if (h >= 0) atomicAdd(&vals[h], Ax[e] * Bx[b]);  // h < 0 cannot happen: S >= nnz of the row
                return false;
            });
        if (fresh) atomicAdd(&distinct[slot], fresh);
    }
    __syncthreads();
    // one pass (Cp null): the row goes to its products' range csum[Ap[row]] of an upper-bound
    // buffer and its count to row_nnz; else to C's exact offsets
    const long long base = row < 0 ? 0 : row_offset(Cp, c_base, csum, Ap, row);
    if (row >= 0 && row_nnz && lane == 0) row_nnz[row] = distinct[slot];
    if (sort && S <= RANK_SORT_MAX && S <= RANK_SLOTS * tpr) {
        int mk[RANK_SLOTS];
        T mv[RANK_SLOTS];
#pragma unroll
        for (int j = 0; j < RANK_SLOTS; ++j) {
            const int i = lane + j * tpr;
            mk[j] = i < S ? keys[i] : EMPTY_KEY;
            mv[j] = i < S ? vals[i] : T(0);
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < RANK_SLOTS; ++j)
            if (mk[j] != EMPTY_KEY) keys[atomicAdd(&counts[slot], 1)] = mk[j];
        __syncthreads();
        if (row >= 0) {
            const int c = counts[slot];
            int rank[RANK_SLOTS] = {};
            for (int q = 0; q < c; ++q) {
                const int kq = keys[q];
#pragma unroll
                for (int j = 0; j < RANK_SLOTS; ++j) rank[j] += kq < mk[j];
            }
#pragma unroll
            for (int j = 0; j < RANK_SLOTS; ++j)
                if (mk[j] != EMPTY_KEY) { Cj[base + rank[j]] = mk[j]; Cx[base + rank[j]] = mv[j]; }
        }
    } else if (sort && bm_words) {
        __shared__ int warp_sums[33];
        for (int i = lane; i < S; i += tpr) {
            const int k = keys[i];
            if ((unsigned)k < (unsigned)bm_words << 5) atomicOr(&bm[k >> 5], 1u << (k & 31));   // not EMPTY_KEY
        }
        __syncthreads();
        int w0, w1, total;
        const int n = bitmap_share(bm, bm_words, &w0, &w1);
        const long long pos = base + block_exclusive_sum(n, warp_sums, &total);   // every thread: a block barrier
#if BITMAP_STAGED
        write_bits_staged(bm, w0, w1, pos, base, total, row >= 0, Cj, Cx, [&](int c) { return hash_find(keys, S, c); },
                          [&](int h) { return keys[h]; }, [&](int h) { return vals[h]; });
#else
        if (row >= 0) write_bits(bm, w0, w1, pos, 0, Cj, Cx, [&](int k) { return vals[hash_find(keys, S, k)]; });
#endif
    } else if (sort) {
        // Bitonic sort of every row's whole table (all rows of the block share S).
        for (int k = 2; k <= S; k <<= 1) {
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = lane; i < S; i += tpr) {
                    const int ixj = i ^ j;
                    if (ixj > i) {
                        const int ki = keys[i], kj = keys[ixj];
                        if ((ki > kj) == ((i & k) == 0)) {
                            keys[i] = kj; keys[ixj] = ki;
                            const T t = vals[i]; vals[i] = vals[ixj]; vals[ixj] = t;
                        }
                    }
                }
                __syncthreads();
            }
        }
        if (row >= 0) {
            const int c = distinct[slot];   // the row's nnz
            for (int i = lane; i < c; i += tpr) { Cj[base + i] = keys[i]; Cx[base + i] = vals[i]; }
        }
    } else if (row >= 0) {
        for (int i = lane; i < S; i += tpr) {
            const int k = keys[i];
            if (k != EMPTY_KEY) {
                const int pos = atomicAdd(&counts[slot], 1);
                Cj[base + pos] = k; Cx[base + pos] = vals[i];
            }
        }
    }
}

#define INSTANTIATE_NUMERIC_SHARED(T, W)                                                                     \
    template __global__ void numeric_shared<T, W>(const int*, const int*, const T*, const int*, const int*,  \
        const T*, const long long*, const int*, int, int, int, const long long*, long long, int*, T*, int,    \
        long long*, int, const unsigned long long*);
INSTANTIATE_NUMERIC_SHARED(float, 8)
INSTANTIATE_NUMERIC_SHARED(float, 16)
INSTANTIATE_NUMERIC_SHARED(float, 32)
INSTANTIATE_NUMERIC_SHARED(double, 8)
INSTANTIATE_NUMERIC_SHARED(double, 16)
INSTANTIATE_NUMERIC_SHARED(double, 32)
template __global__ void symbolic_shared<8>(const int*, const int*, const int*, const int*, const long long*,
        const int*, int, int, int, long long*, int*, int, int*);
template __global__ void symbolic_shared<16>(const int*, const int*, const int*, const int*, const long long*,
        const int*, int, int, int, long long*, int*, int, int*);
template __global__ void symbolic_shared<32>(const int*, const int*, const int*, const int*, const long long*,
        const int*, int, int, int, long long*, int*, int, int*);
