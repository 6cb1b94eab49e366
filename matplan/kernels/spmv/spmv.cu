// SpMV / SpMM kernels: y = A x and Y = A X (X row-major n x k, Y row-major m x k).
//
// Every kernel is templated over the value type T (float, double) and the index
// type I (int, long long). Column j of X/Y is blockIdx.y, so one launch covers
// all k columns (A is streamed once per column; for k = 1 this is plain SpMV).
// Every kernel writes each element of y exactly once (no zero-fill needed)
// except BRC, whose caller zeroes y first.
//
// Compiles with NVRTC (CuPy RawModule) and with plain nvcc -c (no host headers).

#define FULL_MASK 0xffffffffu
// Loads of this many entries are issued before their products are added (in order).
#define UNROLL 4

// sum of data[q] * x[indices[q] * k + j] over q = p, p + S, ... < e: UNROLL loads issued before
// their products are added, in order (the rounding of a plain loop); the row loop of CSR scalar
// (S = 1), vector (S = W lanes) and split (also S = the block, over a chunk).
template <int S, typename T, typename I, typename P>
__device__ __forceinline__ T strided_sum(P p, const P e, const I* __restrict__ indices,
                                         const T* __restrict__ data, const T* __restrict__ x,
                                         const int k, const int j) {
    T s = 0;
    for (; p + (UNROLL - 1) * S < e; p += UNROLL * S) {
        I c[UNROLL]; T v[UNROLL], xv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) { c[u] = indices[p + u * S]; v[u] = data[p + u * S]; }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) xv[u] = x[(long long)c[u] * k + j];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) s += v[u] * xv[u];
    }
    for (; p < e; p += S)
        s += data[p] * x[(long long)indices[p] * k + j];
    return s;
}

// ---------------------------------------------------------------- CSR scalar
// Thread per row: simple, uncoalesced loads of A (each lane walks its own row).
template <typename T, typename I>
__global__ void csr_scalar(const I m, const int k, const I* __restrict__ indptr,
                           const I* __restrict__ indices, const T* __restrict__ data,
                           const T* __restrict__ x, T* __restrict__ y) {
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m) return;
    const int j = blockIdx.y;
    y[row * k + j] = strided_sum<1>(indptr[row], indptr[row + 1], indices, data, x, k, j);
}

// ---------------------------------------------------------------- CSR vector
// W lanes per row (W = 2..32, a power of two): lanes read consecutive nonzeros
// (coalesced), then a fixed-order shuffle tree: deterministic.
template <typename T, typename I, int W>
__global__ void csr_vector(const I m, const int k, const I* __restrict__ indptr,
                           const I* __restrict__ indices, const T* __restrict__ data,
                           const T* __restrict__ x, T* __restrict__ y) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = tid / W;
    const int lane = threadIdx.x & (W - 1);
    const int j = blockIdx.y;
    const bool active = row < m;   // no early return: the shuffles need the whole warp
    T s = active ? strided_sum<W>(indptr[row] + lane, indptr[row + 1], indices, data, x, k, j) : T(0);
#pragma unroll
    for (int off = W / 2; off > 0; off /= 2)
        s += __shfl_down_sync(FULL_MASK, s, off, W);
    if (active && lane == 0) y[row * k + j] = s;
}

// ---------------------------------------------------------------- CSR split: long rows in chunks
// CSR vector for rows of at most `limit` nonzeros; the longer rows (a web graph's hubs, a few
// percent of the rows with a fifth of the nonzeros) would hold one lane group for their whole
// length, so they are cut into chunks of SPLIT_CHUNK nonzeros [chunk_lo[c], chunk_hi[c]), a block
// each: the first nchunks blocks take the chunks (the longest work starts first), the rest are
// the row groups, which leave the long rows alone. A chunk block sums its chunk (lanes strided by
// the block, fixed shuffle trees, warp sums in warp order) into carry[c], then takes a ticket on
// its row's counter: the block that completes the row (ticket + 1 a multiple of the row's chunk
// count: the counters only grow, so calls on one stream need no reset) adds the row's chunk sums
// in chunk order into y. One launch, no atomics on values: bitwise reproducible.
#define SPLIT_THREADS 256
template <typename T, typename I, int W>
__global__ void __launch_bounds__(SPLIT_THREADS)
csr_split(const I m, const int k, const I* __restrict__ indptr, const I* __restrict__ indices,
          const T* __restrict__ data, const T* __restrict__ x, T* __restrict__ y, const I limit,
          const long long nchunks, const long long* __restrict__ chunk_lo,
          const long long* __restrict__ chunk_hi, const long long* __restrict__ chunk_row,
          const long long* __restrict__ fix_rows, const long long* __restrict__ fix_lo,
          const long long* __restrict__ fix_hi, T* carry, unsigned long long* tickets) {
    const int j = blockIdx.y;
    if ((long long)blockIdx.x < nchunks) {
        __shared__ T s_warp[SPLIT_THREADS / 32];
        const long long c = blockIdx.x;
        T s = strided_sum<SPLIT_THREADS>(chunk_lo[c] + threadIdx.x, chunk_hi[c], indices, data, x, k, j);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_down_sync(FULL_MASK, s, off);
        if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x >> 5] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            T t = 0;
#pragma unroll
            for (int w = 0; w < SPLIT_THREADS / 32; ++w) t += s_warp[w];
            carry[c * k + j] = t;
            __threadfence();                           // the sum is visible before the ticket
            const long long r = chunk_row[c];          // index among the long rows
            const long long lo = fix_lo[r], n_r = fix_hi[r] - lo;
            const unsigned long long ticket = atomicAdd(tickets + r * k + j, 1ull);
            if ((ticket + 1) % (unsigned long long)n_r == 0) {   // every chunk of the row is in
                __threadfence();
                T total = 0;
                for (long long q = lo; q < lo + n_r; ++q) total += __ldcg(carry + q * k + j);
                y[fix_rows[r] * k + j] = total;
            }
        }
        return;   // the whole block returns: no row group shares it
    }
    const long long tid = ((long long)blockIdx.x - nchunks) * SPLIT_THREADS + threadIdx.x;
    const long long row = tid / W;
    const int lane = threadIdx.x & (W - 1);
    // no early return: the shuffles need the whole warp; a long row is its chunks' to write
    const bool mine = row < m && indptr[row + 1] - indptr[row] <= limit;
    T s = mine ? strided_sum<W>(indptr[row] + lane, indptr[row + 1], indices, data, x, k, j) : T(0);
#pragma unroll
    for (int off = W / 2; off > 0; off /= 2)
        s += __shfl_down_sync(FULL_MASK, s, off, W);
    if (mine && lane == 0) y[row * k + j] = s;
}

// ---------------------------------------------------------------- CSR SpMM, rows of X read whole
// Y = A X with k >= 2: a group of KK * S lanes per row of A (KK, S powers of two, KK * S <= 32).
// Lane (slot q, column c) of the group adds A[r, p] * X[col_p, c0 + c] over nonzeros p = q, q + S,
// ... of the row: the KK lanes of a slot read KK consecutive elements of one row of X (coalesced)
// and share one load of A's entry, so A is read once per KK columns instead of once per column
// (the kernels above run one column per blockIdx.y). Slots are summed by a fixed shuffle tree:
// deterministic.
template <typename T, typename I, int KK, int S>
__global__ void csr_spmm(const I m, const int k, const I* __restrict__ indptr,
                         const I* __restrict__ indices, const T* __restrict__ data,
                         const T* __restrict__ x, T* __restrict__ y) {
    constexpr int G = KK * S;
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / G;
    const int g = threadIdx.x & (G - 1);
    const int slot = g / KK, c = g % KK;
    const bool active = row < m;   // no early return: the shuffles need the whole warp
    I b = 0, e = 0;
    if (active) { b = indptr[row] + slot; e = indptr[row + 1]; }
    for (int c0 = 0; c0 < k; c0 += KK) {            // k is uniform: every lane takes the same trips
        const int col = c0 + c;
        T s = 0;
        if (active && col < k) {
            I p = b;
            for (; p + S < e; p += 2 * S) {        // two entries in flight, added in order
                const I j0 = indices[p], j1 = indices[p + S];
                const T a0 = data[p], a1 = data[p + S];
                const T x0 = x[(long long)j0 * k + col], x1 = x[(long long)j1 * k + col];
                s += a0 * x0;
                s += a1 * x1;
            }
            if (p < e) s += data[p] * x[(long long)indices[p] * k + col];
        }
#pragma unroll
        for (int off = G / 2; off >= KK; off /= 2)
            s += __shfl_down_sync(FULL_MASK, s, off, G);
        if (active && slot == 0 && col < k) y[row * k + col] = s;
    }
}

// ---------------------------------------------------------------- ELL-R
// Column-major ELL (slot c of row r at c * stride + r) plus row lengths rl:
// thread r reads only rl[r] slots. With rows sorted by length, perm[r] is the
// original row of sorted row r (has_perm = 0: identity, perm is not read).
template <typename T, typename I>
__global__ void ellr(const I m, const int k, const long long stride, const int* __restrict__ rl,
                     const I* __restrict__ cols, const T* __restrict__ vals,
                     const I* __restrict__ perm, const int has_perm,
                     const T* __restrict__ x, T* __restrict__ y) {
    const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    const int j = blockIdx.y;
    const int len = rl[r];
    T s = 0;
    long long idx = r;
    int c = 0;
    for (; c + UNROLL <= len; c += UNROLL, idx += UNROLL * stride) {
        I cc[UNROLL]; T v[UNROLL], xv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) { cc[u] = cols[idx + u * stride]; v[u] = vals[idx + u * stride]; }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) xv[u] = x[(long long)cc[u] * k + j];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) s += v[u] * xv[u];
    }
    for (; c < len; ++c, idx += stride)
        s += vals[idx] * x[(long long)cols[idx] * k + j];
    const long long out = has_perm ? (long long)perm[r] : r;
    y[out * k + j] = s;
}

// ---------------------------------------------------------------- blocked (BRC / BRCP)
// Block b holds H = 32 block rows of width (block_ptr[b+1] - block_ptr[b]) / 32,
// stored column-major inside the block; one warp per block, one lane per block row.
template <typename T, typename I>
__device__ __forceinline__ T block_row_sum(const I* __restrict__ block_ptr, long long b, int lane, int j, int k,
                                           const I* __restrict__ cols, const T* __restrict__ vals,
                                           const T* __restrict__ x) {
    const long long base = block_ptr[b];
    const long long width = ((long long)block_ptr[b + 1] - base) >> 5;
    // padding has col -1 and is skipped, so 0 * inf never reaches y
    T s = 0;
    long long idx = base + lane, c = 0;
    for (; c + UNROLL <= width; c += UNROLL, idx += UNROLL * 32) {
        long long cc[UNROLL]; T v[UNROLL], xv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) { cc[u] = cols[idx + u * 32]; v[u] = vals[idx + u * 32]; }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) xv[u] = cc[u] >= 0 ? x[cc[u] * k + j] : T(0);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) if (cc[u] >= 0) s += v[u] * xv[u];
    }
    for (; c < width; ++c, idx += 32) {
        const long long col = cols[idx];
        if (col >= 0) s += vals[idx] * x[col * k + j];
    }
    return s;
}

// BRC baseline: every block row atomically adds its partial sum into y[row_perm].
// The order of the atomics varies run to run, so the result is NOT bitwise
// reproducible when a row spans three or more block rows. y must be zero on entry.
template <typename T, typename I>
__global__ void brc(const long long nblocks, const int k, const I* __restrict__ block_ptr,
                    const I* __restrict__ row_perm, const I* __restrict__ cols,
                    const T* __restrict__ vals, const T* __restrict__ x, T* __restrict__ y) {
    const long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= nblocks) return;
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.y;
    const T s = block_row_sum<T, I>(block_ptr, b, lane, j, k, cols, vals, x);
    const long long row = row_perm[b * 32 + lane];
    if (row >= 0) atomicAdd(&y[row * k + j], s);
}

// BRCP: a warp-level segmented inclusive scan over the block rows (segments are
// runs of equal row_perm, marked by row_seg_len > 0 at their head), with
// __shfl_up_sync in a fixed order. The last lane of each segment holds the
// segment's sum and stores it to dest[lane]:
//   dest >= 0      the row lies in this block only: y[dest] = sum (plain store);
//   dest <= -2     the row spans several blocks: partials[-dest - 2] = sum;
//   dest == -1     padding block row, nothing stored.
// An empty row has one block row of its own (width 0 in the last blocks), so its 0 is stored here.
// The paper instead atomically adds every segment's sum into a zeroed y and
// argues that this is deterministic while a row spans at most two blocks,
// because 0 + a + b and 0 + b + a round identically (a + b = b + a), and picks
// V >= ceil(nnz / 64) so that a long row spans at most 64 block rows; with three
// or more blocks (a + b) + c and (a + c) + b can differ. Here no atomics are
// used: brcp_fixup adds each spanning row's partials in block order, so the
// result is bitwise reproducible for any number of blocks per row.
template <typename T, typename I>
__global__ void brcp(const long long nblocks, const int k, const I* __restrict__ block_ptr,
                     const int* __restrict__ row_seg_len, const I* __restrict__ dest,
                     const I* __restrict__ cols, const T* __restrict__ vals,
                     const T* __restrict__ x, T* __restrict__ y, T* __restrict__ partials) {
    const long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= nblocks) return;   // whole warps exit together (blockDim.x is a multiple of 32)
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.y;
    T v = block_row_sum<T, I>(block_ptr, b, lane, j, k, cols, vals, x);
    const long long slot = b * 32 + lane;
    const unsigned heads = __ballot_sync(FULL_MASK, row_seg_len[slot] > 0) | 1u;
    // lane of this segment's head: the highest head at or below this lane
    const unsigned upto = (lane == 31) ? FULL_MASK : ((2u << lane) - 1u);
    const int start = 31 - __clz(heads & upto);
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const T t = __shfl_up_sync(FULL_MASK, v, d);
        if (lane - d >= start) v += t;
    }
    const bool seg_end = (lane == 31) || ((heads >> (lane + 1)) & 1u);
    if (seg_end) {
        const long long d = dest[slot];
        if (d >= 0) y[d * k + j] = v;
        else if (d <= -2) partials[(-d - 2) * k + j] = v;
    }
}

// Fixed-order reduction of the partial sums of rows spanning several blocks: a
// warp per row, lane l adds partials l, l + 32, ... in order, then a fixed
// shuffle tree. The same order every run, whatever the scheduling.
template <typename T, typename I>
__global__ void brcp_fixup(const I nfix, const int k, const I* __restrict__ fix_rows,
                           const I* __restrict__ fix_ptr, const T* __restrict__ partials,
                           T* __restrict__ y) {
    const long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (t >= nfix) return;   // whole warps exit together
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.y;
    T s = 0;
    for (long long p = (long long)fix_ptr[t] + lane, e = fix_ptr[t + 1]; p < e; p += 32)
        s += partials[p * k + j];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_down_sync(FULL_MASK, s, off);
    if (lane == 0) y[(long long)fix_rows[t] * k + j] = s;
}

// ---------------------------------------------------------------- CSR merge path
// Merrill & Garland (2016): the m row ends and the nnz nonzeros are merged into one
// path of m + nnz items, and every thread block takes MERGE_NT * IPT consecutive
// items whatever the row lengths (load balance for power-law and skewed rows).
// Row end r sits at path position r + indptr[r + 1]; tile_row[t] (built in prepare)
// is the row at diagonal t * TILE. A block stages its row ends and its products
// (coalesced loads) in shared memory; each thread binary-searches its own start
// there and consumes IPT items: a nonzero adds its product, a row end stores the
// row. A thread's first row end may continue rows of earlier threads: their sums come
// from a fixed-order segmented scan over the block's threads. The part of the row
// still open at the end of the tile goes to carry[tile]; merge_fixup adds each row's
// carries in tile order. No atomics: bitwise reproducible. IPT is odd: thread t reads
// s_prod[t * IPT + i], and an even stride would put many lanes on one shared-memory bank.
// SpMM: a block takes columns j0 .. j0 + kc of X (blockIdx.y = j0 / kc): the tile's row ends,
// indices and values are loaded and each thread's path start searched once, then each
// column re-stages only the products (X rows of the tile's columns stay in L1 across them).
#define MERGE_NT 128

template <typename T, typename I, int IPT, int MERGE_V>
__global__ void __launch_bounds__(MERGE_NT)
csr_merge(const long long m, const long long nnz, const int k, const int kc, const long long* __restrict__ tile_row,
          const I* __restrict__ indptr, const I* __restrict__ indices, const T* __restrict__ data,
          const T* __restrict__ x, T* __restrict__ y, T* __restrict__ carry) {
    constexpr int TILE = MERGE_NT * IPT;
    __shared__ T s_prod[MERGE_V][TILE];
    __shared__ I s_end[TILE + 1];
    __shared__ T s_wsum[MERGE_V][MERGE_NT / 32];
    __shared__ int s_wflag[MERGE_NT / 32];
    const long long tile = blockIdx.x;
    const int j0 = blockIdx.y * kc;
    const int j1 = (j0 + kc < k) ? j0 + kc : k;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long total = m + nnz;
    const long long d0 = tile * TILE;
    const long long d1 = (d0 + TILE < total) ? d0 + TILE : total;
    const long long r0 = tile_row[tile], r1 = tile_row[tile + 1];
    const long long n0 = d0 - r0, n1 = d1 - r1;
    const int nlen = (int)(n1 - n0), rcount = (int)(r1 - r0);
    // stage the tile's row ends (rows r0 .. r1; r1 = m: nnz) in shared memory and keep its
    // indices and values in registers. Every global load is issued before the gathers of x,
    // so the first column costs two memory round trips, not three.
    I c[IPT]; T v[IPT];
    {
        I e[IPT];
#pragma unroll
        for (int u = 0; u < IPT; ++u) {
            const int i = tid + u * MERGE_NT;
            if (i <= rcount) e[u] = (r0 + i < m) ? indptr[r0 + i + 1] : (I)nnz;
            if (i < nlen) { c[u] = indices[n0 + i]; v[u] = data[n0 + i]; }
        }
        if (tid == 0 && rcount == TILE) s_end[TILE] = (r1 < m) ? indptr[r1 + 1] : (I)nnz;
#pragma unroll
        for (int u = 0; u < IPT; ++u) {
            const int i = tid + u * MERGE_NT;
            if (i <= rcount) s_end[i] = e[u];
        }
    }
    __syncthreads();
    // this thread's start on the path: local row tr0 = #{i < rcount : r0 + i + s_end[i] < D}
    long long D = d0 + (long long)tid * IPT;
    if (D > d1) D = d1;
    int lo = 0, hi = rcount;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (r0 + mid + (long long)s_end[mid] < D) lo = mid + 1; else hi = mid;
    }
    const int tr0 = lo;
    const long long nz0 = D - (r0 + tr0);
    // columns in chunks of MERGE_V (1 for SpMV: a wider chunk costs registers and shared
    // memory, hence resident blocks): the chunk's values of an X row are adjacent (one
    // sector), so X rows are fetched once per chunk, not once per column
    for (int j = j0; j < j1; j += MERGE_V) {
        const int nv = (j1 - j < MERGE_V) ? j1 - j : MERGE_V;
#pragma unroll
        for (int u = 0; u < IPT; ++u) {
            const int i = tid + u * MERGE_NT;
            if (i < nlen) {
                const T* xr = x + (long long)c[u] * k + j;
                T xv[MERGE_V];
#pragma unroll
                for (int q = 0; q < MERGE_V; ++q) xv[q] = (q < nv) ? xr[q] : T(0);
#pragma unroll
                for (int q = 0; q < MERGE_V; ++q) s_prod[q][i] = v[u] * xv[q];
            }
        }
        __syncthreads();
        int tr = tr0;
        long long nz = nz0;
        T sum[MERGE_V], first_val[MERGE_V];
#pragma unroll
        for (int q = 0; q < MERGE_V; ++q) { sum[q] = 0; first_val[q] = 0; }
        long long first_row = -1;
#pragma unroll
        for (int it = 0; it < IPT; ++it) {
            if (D + it >= d1) break;
            if ((long long)s_end[tr] <= nz) {          // row end: the row is complete here
                const long long row = r0 + tr;
                if (first_row < 0) {
                    first_row = row;
#pragma unroll
                    for (int q = 0; q < MERGE_V; ++q) first_val[q] = sum[q];
                } else {
#pragma unroll
                    for (int q = 0; q < MERGE_V; ++q) if (q < nv) y[row * k + j + q] = sum[q];
                }
#pragma unroll
                for (int q = 0; q < MERGE_V; ++q) sum[q] = 0;
                ++tr;
            } else {
#pragma unroll
                for (int q = 0; q < MERGE_V; ++q) sum[q] += s_prod[q][nz - n0];
                ++nz;
            }
        }
        // segmented scan over threads of (has a row end, trailing sum): fixed order
        const int f0 = first_row >= 0;
        int f = f0;
        T s[MERGE_V];
#pragma unroll
        for (int q = 0; q < MERGE_V; ++q) s[q] = sum[q];
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int tf = __shfl_up_sync(FULL_MASK, f, d);
#pragma unroll
            for (int q = 0; q < MERGE_V; ++q) {
                const T ts = __shfl_up_sync(FULL_MASK, s[q], d);
                if (lane >= d && !f) s[q] = ts + s[q];
            }
            if (lane >= d) f |= tf;
        }
        if (lane == 31) {
#pragma unroll
            for (int q = 0; q < MERGE_V; ++q) s_wsum[q][warp] = s[q];
            s_wflag[warp] = f;
        }
        int exf = __shfl_up_sync(FULL_MASK, f, 1);
        if (lane == 0) exf = 0;
        T ex[MERGE_V];
#pragma unroll
        for (int q = 0; q < MERGE_V; ++q) {
            ex[q] = __shfl_up_sync(FULL_MASK, s[q], 1);
            if (lane == 0) ex[q] = 0;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < MERGE_V; ++q) {
            if (q >= nv) break;
            T ps = 0;                                  // prefix of the earlier warps, in warp order
            for (int w = 0; w < warp; ++w) ps = s_wflag[w] ? s_wsum[q][w] : ps + s_wsum[q][w];
            if (first_row >= 0) y[first_row * k + j + q] = (exf ? ex[q] : ps + ex[q]) + first_val[q];
            if (tid == MERGE_NT - 1 && r1 < m) carry[tile * k + j + q] = f ? s[q] : ps + s[q];
        }
        __syncthreads();                               // s_prod and s_wsum are rewritten next chunk
    }
}

// Rows whose sums cross tiles: a warp per row adds carry[lo .. hi) in tile order (lane l
// takes lo + l, lo + l + 32, ..., then a fixed shuffle tree) onto the row's stored part.
template <typename T>
__global__ void merge_fixup(const long long nfix, const int k, const long long* __restrict__ fix_rows,
                            const long long* __restrict__ fix_lo, const long long* __restrict__ fix_hi,
                            const T* __restrict__ carry, T* __restrict__ y) {
    const long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (t >= nfix) return;   // whole warps exit together
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.y;
    T s = 0;
    for (long long p = fix_lo[t] + lane, e = fix_hi[t]; p < e; p += 32)
        s += carry[p * k + j];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_down_sync(FULL_MASK, s, off);
    if (lane == 0) y[fix_rows[t] * k + j] += s;
}

// Explicit instantiations so that plain `nvcc -c` checks every template.
#ifndef __CUDACC_RTC__
#define MP_SPMM(T, I, KK, S)                                                                       \
    template __global__ void csr_spmm<T, I, KK, S>(const I, const int, const I*, const I*,         \
                                                   const T*, const T*, T*);
#define MP_INST(T, I)                                                                              \
    template __global__ void csr_scalar<T, I>(const I, const int, const I*, const I*, const T*,    \
                                              const T*, T*);                                       \
    template __global__ void csr_vector<T, I, 2>(const I, const int, const I*, const I*, const T*, \
                                                 const T*, T*);                                    \
    template __global__ void csr_vector<T, I, 32>(const I, const int, const I*, const I*,          \
                                                  const T*, const T*, T*);                         \
    MP_SPMM(T, I, 4, 1) MP_SPMM(T, I, 4, 2) MP_SPMM(T, I, 4, 4) MP_SPMM(T, I, 4, 8)                \
    MP_SPMM(T, I, 8, 1) MP_SPMM(T, I, 8, 2) MP_SPMM(T, I, 8, 4)                                    \
    MP_SPMM(T, I, 16, 1) MP_SPMM(T, I, 16, 2) MP_SPMM(T, I, 32, 1)                                 \
    template __global__ void ellr<T, I>(const I, const int, const long long, const int*, const I*, \
                                        const T*, const I*, const int, const T*, T*);              \
    template __global__ void brc<T, I>(const long long, const int, const I*, const I*, const I*,   \
                                       const T*, const T*, T*);                                    \
    template __global__ void brcp<T, I>(const long long, const int, const I*, const int*,          \
                                        const I*, const I*, const T*, const T*, T*, T*);           \
    template __global__ void brcp_fixup<T, I>(const I, const int, const I*, const I*, const T*, T*); \
    template __global__ void csr_split<T, I, 2>(const I, const int, const I*, const I*, const T*,  \
        const T*, T*, const I, const long long, const long long*, const long long*, const long long*, \
        const long long*, const long long*, const long long*, T*, unsigned long long*);              \
    template __global__ void csr_split<T, I, 32>(const I, const int, const I*, const I*, const T*, \
        const T*, T*, const I, const long long, const long long*, const long long*, const long long*, \
        const long long*, const long long*, const long long*, T*, unsigned long long*);              \
    template __global__ void csr_merge<T, I, 7, 1>(const long long, const long long, const int,      \
                                                   const int, const long long*, const I*, const I*,  \
                                                   const T*, const T*, T*, T*);                      \
    template __global__ void csr_merge<T, I, 7, 4>(const long long, const long long, const int,      \
                                                   const int, const long long*, const I*, const I*,  \
                                                   const T*, const T*, T*, T*);
MP_INST(float, int)
MP_INST(double, int)
MP_INST(float, long long)
MP_INST(double, long long)
template __global__ void merge_fixup<float>(const long long, const int, const long long*, const long long*,
                                           const long long*, const float*, float*);
template __global__ void merge_fixup<double>(const long long, const int, const long long*, const long long*,
                                            const long long*, const double*, double*);
#endif
