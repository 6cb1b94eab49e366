// Device code every hash SpGEMM kernel shares (hash_*.cu): the product walk and where a row is
// written. C = A * B, both CSR with int32 indices (cupyx's index type).
//
// Work mapping: the products of row i are numbered p in [csum[A.indptr[i]], csum[A.indptr[i+1]])
// where csum is the exclusive scan of nnz(B[j,:]) over A's nonzeros (int64, so more than 2^31
// products are fine). The TPR threads of a row are groups of W lanes (W = TPR = 8 or 16 for short
// rows, several rows a warp; else whole warps, W = 32), each taking an equal range of the row's
// products whatever the A/B row lengths (for_each_product); consecutive lanes read consecutive
// entries of B's rows.
//
// Several rows can share a block (RPB rows, TPR = blockDim.x / RPB threads each); the table size
// S (a power of two) and RPB are launch arguments, shared memory is dynamic.
//
// Row panels: the numeric kernels write row `row` of C at Cp[row] - c_base, so a launch over the
// rows of one panel [r0, r1) fills that panel's own Cj/Cx (c_base = Cp[r0]) while row ids, A's
// indptr and csum stay global; c_base = 0 writes the whole C.
//
// Each hash_*.cu compiles with NVRTC (CuPy RawModule, -I this folder) and with plain nvcc -c
// (no host headers).
#ifndef MATPLAN_SPGEMM_HASH_COMMON_CUH
#define MATPLAN_SPGEMM_HASH_COMMON_CUH

#define EMPTY_KEY 0x7fffffff
#define FULL_MASK 0xffffffffu

// Dynamic shared memory of every kernel here (one declaration: one linkage).
extern __shared__ __align__(16) unsigned char smem[];

// Walk the products of `row` that thread `lane` of its `tpr` threads owns, calling f(k, e, b) for
// product p = A(row, col e) * B(col e, column k) read at B's position b. The row's threads are
// groups of W consecutive lanes: one group of 8 or 16 lanes of a warp (tpr == W: short rows,
// several rows a warp) or tpr / 32 whole warps (W = 32). Products are numbered by csum (the
// exclusive scan of nnz(B[j,:]) over A's nonzeros); group g of the row's ng groups takes the
// g-th of ng equal ranges of the row's products, whatever the A/B row lengths. A group finds the
// nonzero its range starts in by a W-ary search over csum, then takes A's row W nonzeros at a
// time from there: lane t loads csum, B's row start and (for the caller) the A index of nonzero t
// of the chunk, once per chunk; the group takes the chunk's products in its range W at a time,
// and each lane finds its product's nonzero by a binary search over the group's csum
// (__shfl_sync of width W): no chain of dependent global loads per product (csum -> Aj -> Bp),
// no block barrier. Equal product ranges replaced whole chunks a warp, which left a chunk holding
// a long row of B to one warp (skewed-spgemm: a 13.6k-nonzero row of A over a 50k-nonzero row of
// B took 957 us). Every lane of a group runs the same loop trips (the shuffles need them); f
// returns true to stop, which ends the walk for the whole group after the round in which any of
// its lanes said so.
template <int W, typename F>
__device__ __forceinline__ void for_each_product(
        const int* __restrict__ Ap, const int* __restrict__ Aj, const int* __restrict__ Bp,
        const int* __restrict__ Bj, const long long* __restrict__ csum, const int row,
        const int lane, const int tpr, F f) {
    const int lw = lane & (W - 1), ng = tpr / W, g = lane / W;
    const int gbase = threadIdx.x & 31 & ~(W - 1);                 // the group's first lane in its warp
    const unsigned bits = W == 32 ? FULL_MASK : (1u << W) - 1u, mask = bits << gbase;
    const int a0 = Ap[row], a1 = Ap[row + 1];
    if (a0 == a1) return;
    const long long first = csum[a0], P = csum[a1] - first;
    const long long p0 = first + P * g / ng, p1 = first + P * (g + 1) / ng;
    if (p0 >= p1) return;
    int lo = a0, hi = a1;   // csum[lo] <= p0 < csum[hi]: the range starts in nonzero lo
    while (g > 0 && hi - lo > 1) {   // the first group starts at a0 (csum[a0] = p0)
        const int e = lo + (int)((long long)(hi - lo) * lw / W);   // lane 0 probes lo itself
        const unsigned ok = (__ballot_sync(mask, csum[e] <= p0) >> gbase) & bits;
        const int t = 31 - __clz(ok);
        const int next = t + 1 < W ? __shfl_sync(mask, e, t + 1, W) : hi;
        lo = __shfl_sync(mask, e, t, W);
        hi = next;
    }
    for (int c0 = lo; c0 < a1; c0 += W) {
        const int cn = min(W, a1 - c0);
        const long long q1 = min(csum[c0 + cn], p1);
        long long cs = 0x7fffffffffffffffLL;
        int bs = 0;
        if (lw < cn) { cs = csum[c0 + lw]; bs = Bp[Aj[c0 + lw]]; }
        const long long q0 = max(__shfl_sync(mask, cs, 0, W), p0);
        for (long long base = q0; base < q1; base += W) {
            const long long p = base + lw;
            int t = 0;
#pragma unroll
            for (int step = W / 2; step > 0; step >>= 1) {
                const long long v = __shfl_sync(mask, cs, t + step, W);
                if (v <= p) t += step;
            }
            const long long off = p - __shfl_sync(mask, cs, t, W);
            const int b = __shfl_sync(mask, bs, t, W) + (int)off;
            bool quit = false;
            if (p < q1) quit = f(Bj[b], c0 + t, b);
            if (__any_sync(mask, quit)) return;
        }
        if (q1 == p1) return;
    }
}

// Where the numeric kernels write row `row`: C's offset Cp[row] - c_base (row panels, above), or,
// Cp null, the one-pass layout: the row's products' offset csum[Ap[row]] of the upper-bound buffer.
__device__ __forceinline__ long long row_offset(const long long* __restrict__ Cp, const long long c_base,
                                                const long long* __restrict__ csum, const int* __restrict__ Ap,
                                                const int row) {
    return Cp ? Cp[row] - c_base : csum[Ap[row]];
}

#endif  // MATPLAN_SPGEMM_HASH_COMMON_CUH
