// The values-only replay of the hash SpGEMM (kernels/spgemm/values.py): for an unchanged
// sparsity pattern, C's values are recomputed from a kept list of the products each entry of C
// sums, with no hashing, sorting or structure work.
//
// Setup, from C = A B already computed (rows sorted by column, no duplicates):
//   values_count   every product p located (its A entry a, B entry b, C entry e by a binary search
//                  of b's column in C's row) and counted per entry;
//   (scan_rows)    the counts' scan gives off, the products of entry e at [off[e], off[e + 1]);
//   values_place   every product written into its entry's range as the 64-bit key a << 32 | b, in
//                  an order the atomics pick;
//   values_sort_*  each entry's keys sorted (a rank sort: keys are distinct), so the list is in
//                  product order, whatever order the atomics took: the sums are reproducible.
// Replay: values_differ compares A's and B's indptr and indices with the kept copies (one flag),
// values_replay sums C.data[e] = sum of A.data[a] * B.data[b] over e's keys, L lanes an entry.
#include "hash_common.cuh"

// First index in [lo, hi) whose value exceeds x (hi when none).
template <typename V>
__device__ __forceinline__ long long upper_index(const V* __restrict__ v, long long lo, long long hi, long long x) {
    while (lo < hi) {
        const long long mid = lo + ((hi - lo) >> 1);
        if ((long long)v[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Product p's A entry a, B entry b and C entry e (-1: C's row lacks the column, a pattern that is
// not A B's).
__device__ __forceinline__ void locate(long long p, const int* __restrict__ Ap, const int* __restrict__ Aj,
                                       const int* __restrict__ Bp, const int* __restrict__ Bj,
                                       const long long* __restrict__ csum, long long nnz_a, int m,
                                       const int* __restrict__ Cp, const int* __restrict__ Cj,
                                       long long& a, long long& b, long long& e) {
    a = upper_index(csum, 0, nnz_a + 1, p) - 1;
    const long long i = upper_index(Ap, 0, (long long)m + 1, a) - 1;
    b = (long long)Bp[Aj[a]] + (p - csum[a]);
    const int c = Bj[b];
    long long lo = Cp[i], hi = Cp[i + 1];
    while (lo < hi) {   // first position of C's row whose column is >= c
        const long long mid = lo + ((hi - lo) >> 1);
        if (Cj[mid] < c) lo = mid + 1; else hi = mid;
    }
    e = (lo < (long long)Cp[i + 1] && Cj[lo] == c) ? lo : -1;
}

// cnt[e] += 1 for every product of entry e (cnt zeroed); *bad = 1 where a product's column is
// missing from C's row.
extern "C" __global__ void values_count(const int* __restrict__ Ap, const int* __restrict__ Aj,
                                        const int* __restrict__ Bp, const int* __restrict__ Bj,
                                        const long long* __restrict__ csum, const long long nnz_a, const int m,
                                        const int* __restrict__ Cp, const int* __restrict__ Cj,
                                        const long long products, unsigned long long* __restrict__ cnt,
                                        unsigned long long* __restrict__ bad) {
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= products) return;
    long long a, b, e;
    locate(p, Ap, Aj, Bp, Bj, csum, nnz_a, m, Cp, Cj, a, b, e);
    if (e < 0) { *bad = 1ull; return; }
    atomicAdd(&cnt[e], 1ull);
}

// keys[off[e] + k] = a << 32 | b for the k-th product of entry e to arrive (cur zeroed).
extern "C" __global__ void values_place(const int* __restrict__ Ap, const int* __restrict__ Aj,
                                        const int* __restrict__ Bp, const int* __restrict__ Bj,
                                        const long long* __restrict__ csum, const long long nnz_a, const int m,
                                        const int* __restrict__ Cp, const int* __restrict__ Cj,
                                        const long long products, const long long* __restrict__ off,
                                        unsigned long long* __restrict__ cur, unsigned long long* __restrict__ keys) {
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= products) return;
    long long a, b, e;
    locate(p, Ap, Aj, Bp, Bj, csum, nnz_a, m, Cp, Cj, a, b, e);
    if (e < 0) return;   // values_count flagged it: the setup is abandoned
    const long long slot = off[e] + (long long)atomicAdd(&cur[e], 1ull);
    keys[slot] = ((unsigned long long)a << 32) | (unsigned long long)(unsigned)b;
}

// Entries of at most short_max products, a thread each: every key goes to its rank among the
// entry's keys (distinct), from `in` to `out`. Longer entries are listed in longs for
// values_sort_long; counts: [0] entries listed, [1] the longest entry's products, [2] entries of
// no product (C is then not A B's pattern).
extern "C" __global__ void values_sort_short(const long long* __restrict__ off, const long long n,
                                             const unsigned long long* __restrict__ in,
                                             unsigned long long* __restrict__ out, const int short_max,
                                             long long* __restrict__ longs, unsigned long long* __restrict__ counts) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const long long s0 = off[e], len = off[e + 1] - s0;
    if (len == 0) { atomicAdd(&counts[2], 1ull); return; }
    if (len > short_max) {
        longs[atomicAdd(&counts[0], 1ull)] = e;
        atomicMax(&counts[1], (unsigned long long)len);
        return;
    }
    for (long long j = 0; j < len; ++j) {
        const unsigned long long x = in[s0 + j];
        long long r = 0;
        for (long long k = 0; k < len; ++k) r += in[s0 + k] < x;
        out[s0 + r] = x;
    }
}

// The entries of `longs` (n_long of them), a block each: the same rank sort, the entry's keys
// staged through shared memory a tile of blockDim at a time.
extern "C" __global__ void values_sort_long(const long long* __restrict__ off, const long long* __restrict__ longs,
                                            const long long n_long, const unsigned long long* __restrict__ in,
                                            unsigned long long* __restrict__ out) {
    unsigned long long* tile = reinterpret_cast<unsigned long long*>(smem);
    for (long long t = blockIdx.x; t < n_long; t += gridDim.x) {
        const long long e = longs[t];
        const long long s0 = off[e], len = off[e + 1] - s0;
        for (long long base = 0; base < len; base += blockDim.x) {
            const long long j = base + threadIdx.x;
            const unsigned long long x = j < len ? in[s0 + j] : 0ull;
            long long r = 0;
            for (long long t0 = 0; t0 < len; t0 += blockDim.x) {
                __syncthreads();
                if (t0 + threadIdx.x < len) tile[threadIdx.x] = in[s0 + t0 + threadIdx.x];
                __syncthreads();
                const long long w = min((long long)blockDim.x, len - t0);
                for (long long k = 0; k < w; ++k) r += tile[k] < x;
            }
            if (j < len) out[s0 + r] = x;
        }
        __syncthreads();
    }
}

// *flag = 1 where a pair of int arrays differs: pair blockIdx.y of (x0, y0, n0) .. (x3, y3, n3).
extern "C" __global__ void values_differ(const int* __restrict__ x0, const int* __restrict__ y0, const long long n0,
                                         const int* __restrict__ x1, const int* __restrict__ y1, const long long n1,
                                         const int* __restrict__ x2, const int* __restrict__ y2, const long long n2,
                                         const int* __restrict__ x3, const int* __restrict__ y3, const long long n3,
                                         unsigned long long* __restrict__ flag) {
    const int* x = blockIdx.y == 0 ? x0 : blockIdx.y == 1 ? x1 : blockIdx.y == 2 ? x2 : x3;
    const int* y = blockIdx.y == 0 ? y0 : blockIdx.y == 1 ? y1 : blockIdx.y == 2 ? y2 : y3;
    const long long n = blockIdx.y == 0 ? n0 : blockIdx.y == 1 ? n1 : blockIdx.y == 2 ? n2 : n3;
    bool differ = false;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n4 = ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y)) & 15)
                         ? 0 : n / 4;   // 16-byte loads where both arrays are aligned to them
    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < n4; q += stride) {
        const int4 u = reinterpret_cast<const int4*>(x)[q], v = reinterpret_cast<const int4*>(y)[q];
        differ |= (u.x != v.x) | (u.y != v.y) | (u.z != v.z) | (u.w != v.w);
    }
    for (long long q = 4 * n4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; q < n; q += stride)
        differ |= x[q] != y[q];
    if (__syncthreads_or(differ) && threadIdx.x == 0) *flag = 1ull;
}

// C.data[e] = the sum of A.data[a] * B.data[b] over entry e's keys in order, L lanes an entry
// (lane l sums keys l, l + L, ...; then a shuffle tree): the same order every call. Skips when
// *flag is set (values_differ found A's or B's structure changed).
template <typename T, typename O, int L>
__global__ void values_replay(const O* __restrict__ off, const unsigned long long* __restrict__ keys,
                              const T* __restrict__ Ax, const T* __restrict__ Bx, T* __restrict__ Cx,
                              const long long n, const unsigned long long* __restrict__ flag) {
    if (*flag) return;
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long e = g / L;
    const int lane = (int)(g % L);
    T acc = 0;
    if (e < n) {
        const long long s1 = (long long)off[e + 1];
        for (long long s = (long long)off[e] + lane; s < s1; s += L) {
            const unsigned long long k = keys[s];
            acc += Ax[k >> 32] * Bx[(unsigned)k];
        }
    }
    if (L > 1) {
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_down_sync(FULL_MASK, acc, o, L);
    }
    if (e < n && lane == 0) Cx[e] = acc;
}
