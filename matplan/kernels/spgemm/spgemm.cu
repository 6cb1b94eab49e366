// RBSparse hash SpGEMM, C = A * B, both CSR with int32 indices (cupyx's index type).
//
// Work mapping: the products of row i are numbered p in [csum[A.indptr[i]], csum[A.indptr[i+1]])
// where csum is the exclusive scan of nnz(B[j,:]) over A's nonzeros (int64, so more than 2^31
// products are fine). The TPR threads of a row are groups of W lanes (W = TPR = 8 or 16 for short
// rows, several rows a warp; else whole warps, W = 32), each taking an equal range of the row's
// products whatever the A/B row lengths (for_each_product); consecutive lanes read consecutive
// entries of B's rows.
//
// * symbolic_shared: one shared-memory hash table of column keys per row counts the distinct
//   columns (exact nnz of C's row). A table that fills up zeroes the row's count and appends it
//   to a list for symbolic_global (the paper's "invalid row, recomputed in global memory").
// * numeric_shared: keys (atomicCAS) + values (atomicAdd) in shared memory; the table is at least
//   as large as the row's exact nnz, so it never overflows. The row's table is then bitonic-sorted
//   by key (empty keys = INT_MAX sort last) and its first nnz entries written out, or, unsorted,
//   compacted with a shared counter.
// * symbolic_global: rows too large for any shared table, and the rows of big tables
//   (spgemm.SYMBOLIC_BITMAP_RATIO), count their columns in a bitmap of B's columns (shared memory
//   where it fits), a block or a team of blocks a row.
// * numeric_global_acc + numeric_global_out: their numeric pass by a dense accumulator of
//   B.shape[1] slots in global memory, one slab per row of a batch, several blocks per row; marks
//   are stamped with row + 1 so a slab is never cleared between rows; numeric_global_out scans
//   the columns in order, so its output is sorted.
// * numeric_global_seg: the numeric pass of such rows by column segments that fit in shared
//   memory, a block a segment of a row, reading all of the row's products or (sorted B) its part
//   of each B row (spgemm.py chooses it or the slabs).
//
// Several rows can share a block (RPB rows, TPR = blockDim.x / RPB threads each); the table size
// S (a power of two) and RPB are launch arguments, shared memory is dynamic.
//
// Row panels: the numeric kernels write row `row` of C at Cp[row] - c_base, so a launch over the
// rows of one panel [r0, r1) fills that panel's own Cj/Cx (c_base = Cp[r0]) while row ids, A's
// indptr and csum stay global; c_base = 0 writes the whole C.
// Compiles with NVRTC (CuPy RawModule) and with plain nvcc -c (no host headers).

#define EMPTY_KEY 0x7fffffff
#define FULL_MASK 0xffffffffu
#define MAX_RPB 32
#define MAX_GROUPS 32   // table sizes + 2 (empty rows, global path) that classify/bucket handle
#define GLOBAL_SCAN_COLS 8   // columns of the dense accumulator a thread scans per step (numeric_global)

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

// Insert key k into table keys[0..S) (S a power of two). Returns the slot, or -1 when the table is full.
// Counts a newly claimed slot in *fresh.
// The first slot is Fibonacci hashing (the top log2(S) bits of k * 2^32/phi), not k mod S:
// columns of stencil rows step by powers of two (i +- 64, i +- 4096), which k mod S piles onto one
// probe chain. H100 numeric pass, mod -> Fibonacci: Poisson 1020 -> 441 us, block-dense 9.9 ->
// 3.6 ms; banded 638 -> 936 us (scattered slots: bank conflicts in the value atomics). Folding
// the key's chunks by XOR, tried to keep bands in order, lost more: Poisson 791 us, block-dense
// 13.1 ms, skewed's symbolic pass 13.6 -> 32.8 ms (spgemm-phases-h100-2026-11-23-*.log).
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

// Sub-warp rows (W < 32) run in blocks of at most 256 threads (spgemm.BLOCK_THREADS): their
// kernels are compiled for SUBWARP_MIN_BLOCKS such blocks an SM (a register cap), whole-warp
// rows (up to MAX_TPR = 1024 threads a block) as the compiler likes. H100 (6ec3b79): 8 (32
// registers) or 6 moved numeric_shared within noise (ncu had occupancy 62.5%, register-bound):
// default 1, no cap (spgemm-phases-h100-2026-11-23-6ec3b79.log).
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

// Bitmaps of a row's columns, written out in column order (numeric_shared's bitmap branch,
// numeric_global_seg, numeric_esc's window). bitmap_share: thread t's share [*w0, *w1) of `words`
// words split evenly over the block, and the bits set in it (for the caller's block scan).
__device__ __forceinline__ int bitmap_share(const unsigned* bits, const int words, int* w0, int* w1) {
    const int per = (words + blockDim.x - 1) / blockDim.x;
    *w0 = min(words, (int)threadIdx.x * per);
    *w1 = min(words, *w0 + per);
    int n = 0;
    for (int w = *w0; w < *w1; ++w) n += __popc(bits[w]);
    return n;
}

// The set bits of words [w0, w1) from output position pos on: column col0 + c, value value(c),
// for bit c of the bitmap.
template <typename T, typename Value>
__device__ __forceinline__ void write_bits(const unsigned* bits, const int w0, const int w1, long long pos,
                                           const long long col0, int* __restrict__ Cj, T* __restrict__ Cx,
                                           Value value) {
    for (int w = w0; w < w1; ++w)
        for (unsigned x = bits[w]; x; x &= x - 1, ++pos) {
            const int c = (w << 5) | (__ffs(x) - 1);
            Cj[pos] = (int)(col0 + c);
            Cx[pos] = value(c);
        }
}

// write_bits for a whole block's row (or segment) [out0, out0 + total), in two steps with a
// block barrier between: each thread writes tag(c) for the bits of its words at their output
// positions into Cj (scratch), then every entry is rewritten a thread an entry, Cj = col(tag),
// Cx = value(tag). Those writes coalesce where each thread writing its own run of the row did
// not: numeric_shared's bitmap rows 2139 -> 1634 us on block-dense, 7166 -> 6678 on ice40 (H100).
// Every thread of the block calls it; `active` false writes nothing.
template <typename T, typename Tag, typename Col, typename Value>
__device__ __forceinline__ void write_bits_staged(const unsigned* bits, const int w0, const int w1, long long pos,
                                                  const long long out0, const int total, const bool active,
                                                  int* __restrict__ Cj, T* __restrict__ Cx, Tag tag, Col col,
                                                  Value value) {
    if (active)
        for (int w = w0; w < w1; ++w)
            for (unsigned x = bits[w]; x; x &= x - 1, ++pos) Cj[pos] = tag((w << 5) | (__ffs(x) - 1));
    __syncthreads();
    if (active)
        for (int j = threadIdx.x; j < total; j += blockDim.x) {
            const int t = Cj[out0 + j];
            Cj[out0 + j] = col(t);
            Cx[out0 + j] = value(t);
        }
}

// ------------------------------------------------------------------ numeric, shared memory
// Tables of up to RANK_SLOTS slots a thread (S <= RANK_SLOTS * tpr; launch_shape gives every
// table up to 2048 slots that; 2 a thread for whole-warp rows, up to 4 for sub-warp rows) and
// RANK_SORT_MAX slots are sorted by rank: each thread takes its slots into registers, the
// occupied keys are compacted to the front of the table, and each key counts the smaller ones
// among the row's c compacted keys (c^2 broadcast reads a row instead of S^2: a row of 64
// nonzeros in a 128-slot table, uniform random, had 16k comparisons). Larger tables use a
// bitonic sort, or, given bm_words > 0 (one row a block; spgemm.bitmap_words: B's columns fit in
// shared memory beside the table), a bitmap of B's columns: each occupied slot sets its column's
// bit, a block scan of the bit counts over contiguous word ranges (one a thread) gives each range's
// first output position, and each thread walks its range's bits in column order, finds each
// column's slot again (hash_find) and writes it out (write_bits_staged). Its cost is ~k/32 words and nnz probes a row
// instead of the bitonic network's log2(S)(log2(S) + 1)/2 barrier-separated stages over all S slots
// (16384 slots: 105 stages; R-MAT scale 16, H100: the sort was 22.6 of the 35.3 ms of
// numeric_shared, helper measurement 2026-11-24).
#define RANK_SORT_MAX 256
// numeric_shared's bitmap branch and numeric_global_seg write their bitmaps' rows in two steps
// (BITMAP_STAGED 1: write_bits_staged) or each thread its run straight from the bitmap (0).
#ifndef BITMAP_STAGED
#define BITMAP_STAGED 1
#endif
#define RANK_SLOTS (W < 32 ? 4 : 2)

template <typename T, int W>
__global__ void SUBWARP_BOUNDS numeric_shared(
        const int* __restrict__ Ap, const int* __restrict__ Aj, const T* __restrict__ Ax,
        const int* __restrict__ Bp, const int* __restrict__ Bj, const T* __restrict__ Bx,
        const long long* __restrict__ csum, const int* __restrict__ rows, const int nrows,
        const int S, const int rpb, const long long* __restrict__ Cp, const long long c_base,
        int* __restrict__ Cj, T* __restrict__ Cx, const int sort, long long* __restrict__ row_nnz,
        const int bm_words, const unsigned long long* __restrict__ skip) {
    if (skip && *skip) return;   // a guessed launch words_differ refuted (spgemm._guessed)
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

// ------------------------------------------------------------------ numeric, sort-based (ESC)
// Rows of at most W * P products (the one-pass path's short rows): a group of W lanes expands the row's products into registers, P a lane, and
// bitonic-sorts them by column; each product travels as one int, column << ESC_SLOT_BITS | slot,
// its value waiting in shared memory at its slot (one shuffle an exchange across lanes instead of
// three for a double beside its key); runs of equal columns are summed by a segmented scan (within
// each lane, then across lanes by the columns themselves: runs are contiguous) and each run's sum
// is placed at its rank (a shuffle scan of the lanes' run counts) in shared memory, from where the
// group writes the row out coalesced, sorted, its count in row_nnz. No atomics, no block barrier; the sums are deterministic (the network's
// order does not depend on timing). Element i of the sorted sequence is register j of lane
// i / P (i = lane * P + j); product j * W + lane is loaded (coalesced) into register j of lane.
// The slot takes log2(W * P) bits, the column the rest of 31: B's columns must be fewer than
// 2^(31 - log2(W * P)) - 1 (spgemm.esc_max_columns), so no packed product equals EMPTY_KEY.
// Given `window`, a row whose columns span at most W * P skips the sort for esc_window.
// numeric_esc's dense window, for a row whose columns span at most N = W * P (banded rows): the
// row's sums sit at column - lo in the group's N value slots, a bitmap of the columns present in
// its N output slots (as words), and the bitmap, one word a lane, writes the row sorted: no sort
// network. Lanes holding the same column in a round add up in lane order into the lowest of them
// (__match_any_sync), which alone updates the slot: the sums are taken in the products' order,
// deterministic like the sort's. H100 (2026-11-24), banded-spgemm (289 products, 33 columns a
// row): numeric_esc 1170 -> 845 us; shared-memory atomicAdd instead of the match: 865 us. What is
// left is the products' expansion (the csum search, B's loads), the same as the sort's.
template <typename T, int W, int P, int SLOT_BITS>
__device__ __forceinline__ void esc_window(const int (&key)[P], T* vals, unsigned* bits, const long long np,
                                           const int lo, const unsigned mask, const long long base,
                                           int* __restrict__ Cj, T* __restrict__ Cx, long long* row_count,
                                           const long long expect, unsigned long long* refuted) {
    constexpr int N = W * P, WORDS = (N + 31) / 32;   // WORDS <= W: a word a lane at most
    const int lw = threadIdx.x & (W - 1), me = threadIdx.x & 31;
    T v[P];
#pragma unroll
    for (int j = 0; j < P; ++j) v[j] = key[j] != EMPTY_KEY ? vals[j * W + lw] : T(0);
    __syncwarp(mask);
    for (int q = lw; q < N; q += W) vals[q] = T(0);
    if (lw < WORDS) bits[lw] = 0u;
    __syncwarp(mask);
#pragma unroll
    for (int j = 0; j < P; ++j) {
        if ((long long)j * W >= np) break;   // the same for the whole group
        const int c = key[j] != EMPTY_KEY ? (key[j] >> SLOT_BITS) - lo : -1;
        const unsigned peers = __match_any_sync(mask, c);
        const bool leader = c >= 0 && __ffs(peers) - 1 == me;
        unsigned others = leader ? peers & (peers - 1) : 0u;
        T s = v[j];
        while (__any_sync(mask, others != 0u)) {
            const T y = __shfl_sync(mask, v[j], others ? __ffs(others) - 1 : me);
            if (others) { s += y; others &= others - 1; }
        }
        if (leader) { vals[c] += s; atomicOr(&bits[c >> 5], 1u << (c & 31)); }
        __syncwarp(mask);
    }
    const unsigned word = lw < WORDS ? bits[lw] : 0u;
    const int n = __popc(word);
    int before = n;   // inclusive scan of the lanes' counts
#pragma unroll
    for (int d = 1; d < W; d <<= 1) {
        const int y = __shfl_up_sync(mask, before, d, W);
        if (lw >= d) before += y;
    }
    const int total = __shfl_sync(mask, before, W - 1, W);
    if (expect >= 0 && total != expect) {   // a guessed row length (numeric_esc's check)
        if (lw == 0) *refuted = 2ull;
        return;
    }
    write_bits(bits, lw, lw + (n > 0), base + before - n, lo, Cj, Cx, [&](int c) { return vals[c]; });
    if (lw == 0 && row_count) *row_count = total;
}

// Blocks an SM must hold of numeric_esc's 512-slot class (W * P = 512), asked of the compiler
// (__launch_bounds__). Unasked it took 80-89 registers and 3 blocks fit (37.5% occupancy, the
// kernel latency-bound: Nsight Compute on banded, spgemm-esc-ncu-h100-2026-11-24-7dffe5b.log);
// at 4 (64 registers, ~280 bytes of spills in float64) banded's numeric_esc went 1041-1047 ->
// 693 us on an H100 (spgemm-esc-occupancy-h100-2026-11-24-ea8b9dc.log).
#ifndef ESC_MIN_BLOCKS_512
#define ESC_MIN_BLOCKS_512 4
#endif
template <typename T, int W, int P>
__global__ void __launch_bounds__(256, W * P == 512 ? ESC_MIN_BLOCKS_512 : 1) numeric_esc(
        const int* __restrict__ Ap, const int* __restrict__ Aj, const T* __restrict__ Ax,
        const int* __restrict__ Bp, const int* __restrict__ Bj, const T* __restrict__ Bx,
        const long long* __restrict__ csum, const int* __restrict__ rows, const int nrows,
        const long long* __restrict__ Cp, const long long c_base, int* __restrict__ Cj,
        T* __restrict__ Cx, long long* __restrict__ row_nnz, const int window,
        unsigned long long* __restrict__ skip) {
    if (skip && *skip) return;   // a guessed launch words_differ refuted (spgemm._guessed)
    constexpr int N = W * P;
    constexpr int ESC_SLOT_BITS = N <= 16 ? 4 : N <= 32 ? 5 : N <= 64 ? 6 : N <= 128 ? 7 : N <= 256 ? 8 : 9;
    static_assert(N == (1 << ESC_SLOT_BITS), "W * P: a power of two from 16 to 512");
    __shared__ T s_val[256 / W][N];   // launched with 256 threads: each group's values by slot,
    __shared__ int s_col[256 / W][N];  // then its output row (staged: the row is written coalesced)
    const long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / W;
    if (r >= nrows) return;   // a whole group: r is the same on its W lanes
    const int lw = threadIdx.x & (W - 1);
    const int gbase = threadIdx.x & 31 & ~(W - 1);
    const unsigned mask = (W == 32 ? FULL_MASK : (1u << W) - 1u) << gbase;
    T* vals = s_val[threadIdx.x / W];
    int* cols = s_col[threadIdx.x / W];
    const int row = rows ? rows[r] : (int)r;
    const int a0 = Ap[row], a1 = Ap[row + 1], na = a1 - a0;
    const long long first = na ? csum[a0] : 0;
    const long long np = na ? csum[a1] - first : 0;
    if (np > N) __trap();   // the grouping (classify_rows' caps) keeps rows past N out: never silent
    // A's row in the group's lanes when it has at most W nonzeros (each product's nonzero is then
    // found by a shuffle search over the row's product offsets), else a binary search over csum
    int cs = 0x7fffffff, bs = 0;
    if (na <= W && lw < na) { cs = (int)(csum[a0 + lw] - first); bs = Bp[Aj[a0 + lw]]; }
    int key[P];
#pragma unroll
    for (int j = 0; j < P; ++j) key[j] = EMPTY_KEY;
#pragma unroll
    for (int j = 0; j < P; ++j) {
        // no product of the row left (the same for the group): a row of the W * P class has more
        // than half as many products, and the search below ran for the empty rounds too (H100,
        // 2026-11-24: banded 845 -> 768 us, metis 284 -> 262, skewed 104 -> 99, dragon 386 -> 417)
        if ((long long)j * W >= np) break;
        const int p = j * W + lw;
        int e = 0, b = 0;
        if (na <= W) {
            int t = 0;
#pragma unroll
            for (int step = W / 2; step > 0; step >>= 1)
                if (__shfl_sync(mask, cs, t + step, W) <= p) t += step;
            b = __shfl_sync(mask, bs, t, W) + p - __shfl_sync(mask, cs, t, W);
            e = a0 + t;
        } else if (p < np) {
            int lo = a0, hi = a1;   // csum[lo] - first <= p < csum[hi] - first
            while (hi - lo > 1) {
                const int mid = (lo + hi) >> 1;
                if (csum[mid] - first <= p) lo = mid; else hi = mid;
            }
            b = Bp[Aj[lo]] + (int)(p - (csum[lo] - first));
            e = lo;
        }
        if (p < np) {
            key[j] = (Bj[b] << ESC_SLOT_BITS) | p;
            vals[p] = Ax[e] * Bx[b];
        }
    }
    __syncwarp(mask);
    const long long base = Cp ? Cp[row] - c_base : first;
    // guessed offsets (skip and Cp given: spgemm's direct replay): a row of another length than
    // its guessed one writes nothing and refutes the guess
    const long long expect = skip && Cp ? Cp[row + 1] - Cp[row] : -1;
    if (window) {   // the row's columns span [lo, hi]: at most N of them take the dense window
        int lo = EMPTY_KEY, hi = -1;
#pragma unroll
        for (int j = 0; j < P; ++j)
            if (key[j] != EMPTY_KEY) { lo = min(lo, key[j] >> ESC_SLOT_BITS); hi = max(hi, key[j] >> ESC_SLOT_BITS); }
#pragma unroll
        for (int d = W / 2; d > 0; d >>= 1) {
            lo = min(lo, __shfl_xor_sync(mask, lo, d, W));
            hi = max(hi, __shfl_xor_sync(mask, hi, d, W));
        }
        if ((long long)hi - lo < N) {
            esc_window<T, W, P, ESC_SLOT_BITS>(key, vals, reinterpret_cast<unsigned*>(cols), np, lo, mask, base,
                                               Cj, Cx, row_nnz ? row_nnz + row : nullptr, expect, skip);
            return;
        }
    }
    // bitonic sort of the N packed products, ascending (EMPTY_KEY last)
#pragma unroll
    for (int k = 2; k <= N; k <<= 1) {
#pragma unroll
        for (int s = k >> 1; s > 0; s >>= 1) {
            if (s >= P) {
                const int lm = s / P;   // the partner's lane offset; same register
                const bool lower = (lw & lm) == 0;
#pragma unroll
                for (int j = 0; j < P; ++j) {
                    const bool up = ((lw * P + j) & k) == 0;
                    const int ok = __shfl_xor_sync(mask, key[j], lm, W);
                    key[j] = lower == up ? min(key[j], ok) : max(key[j], ok);
                }
            } else {
#pragma unroll
                for (int j = 0; j < P; ++j) {
                    if (j & s) continue;
                    const int jj = j | s;
                    const bool up = ((lw * P + j) & k) == 0;
                    const int lo = min(key[j], key[jj]), hi = max(key[j], key[jj]);
                    key[j] = up ? lo : hi;
                    key[jj] = up ? hi : lo;
                }
            }
        }
    }
    // columns and values back; runs of equal columns: sums within the lane, then the lanes' last
    // runs across lanes
    int col[P];
    T run[P];
#pragma unroll
    for (int j = 0; j < P; ++j) {
        col[j] = key[j] == EMPTY_KEY ? EMPTY_KEY : key[j] >> ESC_SLOT_BITS;
        const T v = key[j] == EMPTY_KEY ? T(0) : vals[key[j] & ((1 << ESC_SLOT_BITS) - 1)];
        run[j] = v + (j > 0 && col[j - 1] == col[j] ? run[j - 1] : T(0));
    }
    const int last = col[P - 1];
    T x = run[P - 1];
#pragma unroll
    for (int d = 1; d < W; d <<= 1) {
        const T y = __shfl_up_sync(mask, x, d, W);
        const int ky = __shfl_up_sync(mask, last, d, W);
        if (lw >= d && ky == last) x += y;
    }
    const T cin = __shfl_up_sync(mask, x, 1, W);
    const int kin = __shfl_up_sync(mask, last, 1, W);
    const T carry = lw > 0 && kin == col[0] ? cin : T(0);
    const int next = __shfl_down_sync(mask, col[0], 1, W);
    bool end[P];
    int count = 0;
#pragma unroll
    for (int j = 0; j < P; ++j) {
        const bool final_ = j + 1 == P && lw + 1 == W;   // the row's last element ends its run
        end[j] = col[j] != EMPTY_KEY && (final_ || col[j] != (j + 1 < P ? col[j + 1] : next));
        count += end[j];
    }
    int before = count;   // inclusive scan of the lanes' run counts
#pragma unroll
    for (int d = 1; d < W; d <<= 1) {
        const int y = __shfl_up_sync(mask, before, d, W);
        if (lw >= d) before += y;
    }
    const int total = __shfl_sync(mask, before, W - 1, W);
    if (expect >= 0 && total != expect) {
        if (lw == 0) *skip = 2ull;
        return;
    }
    before -= count;
    __syncwarp(mask);   // every lane has read its values: the slots take the output row
#pragma unroll
    for (int j = 0; j < P; ++j) {
        if (end[j]) {
            cols[before] = col[j];
            vals[before] = run[j] + (col[j] == col[0] ? carry : T(0));
            ++before;
        }
    }
    __syncwarp(mask);
    for (int q = lw; q < total; q += W) { Cj[base + q] = cols[q]; Cx[base + q] = vals[q]; }
    if (lw == 0 && row_nnz) row_nnz[row] = total;
}

// ------------------------------------------------------------------ scans (one launch each)
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

// csum: the scan of nnz(B[j, :]) over A's nonzeros e (j = Aj[e]): the work index of every product.
extern "C" __global__ void scan_products(const int* __restrict__ Aj, const long long nnz,
                                         const int* __restrict__ Bp, long long* __restrict__ csum,
                                         unsigned long long* status) {
    scan_i64(nnz, [&](long long e) { const int j = Aj[e]; return (long long)(Bp[j + 1] - Bp[j]); },
             csum, nullptr, status);
}

// Cp (and Cp32 unless null): the scan of C's row nnz.
extern "C" __global__ void scan_rows(const long long* __restrict__ row_nnz, const long long m,
                                     long long* __restrict__ Cp, int* __restrict__ Cp32,
                                     unsigned long long* status) {
    scan_i64(m, [&](long long i) { return row_nnz[i]; }, Cp, Cp32, status);
}

// ------------------------------------------------------------------ analysis and grouping
// Table index of every row, in one pass, with the totals the host needs in one transfer.
// need: mode 0 (symbolic) min(row_ct, k), row_ct = csum[Ap[i+1]] - csum[Ap[i]] (nnz_RowCt);
//       mode 1 (numeric) vals[i] (the exact nnz of C's row).
// idx[i] = -1 when need == 0, else the smallest t < T with need <= caps[t], else T (global path);
// mode 0: a row at T whose paper estimate min(row_ct / pi, k) <= top (the largest table) takes
// T - 1 instead and counts as risky (it may overflow and is then redone globally).
// T2 > 0 (mode 0): also the one-pass path's class of every row in idx2, from caps[T .. T + T2)
// (the first n_esc are numeric_esc's product limits, compared with row_ct itself, not
// min(row_ct, k)); T2 when none holds the row; its counts go to acc[2T + 8 + idx2 + 1]: the
// analysis classifies for both paths in one launch and one transfer. A row numeric_esc takes
// (idx2 < n_esc) gets idx -1: it has no symbolic table on the two-pass path either (the hybrid).
// Mode 1 with n_esc > 0 reads idx2 (the analysis's) and gives those rows idx -1 as well.
// acc (zeroed by the caller): [0, T + 2) rows per idx + 1; then the sum, the max and the risky
// count of the row figure (row_ct, or vals in mode 1); then the sum of squares (a double).
// Mirrors spgemm.table_index / symbolic_index (NumPy/CuPy reference in spgemm.py).
extern "C" __global__ void classify_rows(
        const int* __restrict__ Ap, const long long* __restrict__ csum,
        const long long* __restrict__ vals, const int m, const long long k,
        const long long* __restrict__ caps, const int T, const long long top, const int mode,
        const int T2, const int n_esc, int* __restrict__ idx, int* __restrict__ idx2,
        unsigned long long* __restrict__ acc) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    long long fig = 0;
    int risky = 0, g = 0, g2 = 0;
    if (i < m) {
        fig = mode == 0 ? csum[Ap[i + 1]] - csum[Ap[i]] : vals[i];
        const long long need = mode == 0 ? min(fig, k) : fig;
        int t = -1, t2 = -1;
        if (need > 0) {
            t = 0;
            while (t < T && need > caps[t]) ++t;
            if (mode == 0 && t == T && min((double)fig / 3.141592653589793, (double)k) <= (double)top) {
                t = T - 1;
                risky = 1;
            }
            t2 = 0;   // the one-pass classes; the first n_esc (numeric_esc) compare products
            while (t2 < T2 && (t2 < n_esc ? fig : need) > caps[T + t2]) ++t2;
            if (mode == 0 && T2 > 0 && t2 < n_esc) t = -1;   // numeric_esc takes the row on either path
            if (mode == 1 && n_esc > 0 && idx2[i] >= 0 && idx2[i] < n_esc) t = -1;   // it took the row
        }
        idx[i] = t;
        g = t + 1;
        if (T2 > 0) idx2[i] = t2;
        g2 = t2 + 1;
    }
    // block-level totals in shared memory first: one global atomic per figure and block (a warp
    // per atomic serialised ~8k warps on the same words: ~100 us for 262k rows)
    __shared__ unsigned long long s_acc[MAX_GROUPS + 4], s_acc2[MAX_GROUPS];
    __shared__ double s_sq;
    for (int t = threadIdx.x; t < MAX_GROUPS + 4; t += blockDim.x) s_acc[t] = 0;
    for (int t = threadIdx.x; t < MAX_GROUPS; t += blockDim.x) s_acc2[t] = 0;
    if (threadIdx.x == 0) s_sq = 0.0;
    __syncthreads();
    const unsigned live = __ballot_sync(FULL_MASK, i < m);
    if (i < m) {
        const unsigned peers = __match_any_sync(live, g);
        if (lane == __ffs(peers) - 1) atomicAdd(&s_acc[g], (unsigned long long)__popc(peers));
        if (T2 > 0) {
            const unsigned peers2 = __match_any_sync(live, g2);
            if (lane == __ffs(peers2) - 1) atomicAdd(&s_acc2[g2], (unsigned long long)__popc(peers2));
        }
    }
    unsigned long long sum = (unsigned long long)fig, mx = (unsigned long long)fig, nr = risky;
    double sq = (double)fig * (double)fig;
    for (int off = 16; off > 0; off >>= 1) {
        sum += __shfl_down_sync(FULL_MASK, sum, off);
        nr += __shfl_down_sync(FULL_MASK, nr, off);
        sq += __shfl_down_sync(FULL_MASK, sq, off);
        const unsigned long long o = __shfl_down_sync(FULL_MASK, mx, off);
        mx = o > mx ? o : mx;
    }
    if (lane == 0 && sum) {
        atomicAdd(&s_acc[MAX_GROUPS], sum);
        atomicMax(&s_acc[MAX_GROUPS + 1], mx);
        atomicAdd(&s_acc[MAX_GROUPS + 2], nr);
        atomicAdd(&s_sq, sq);
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t < T + 2) {
        if (s_acc[t]) atomicAdd(&acc[t], s_acc[t]);
    } else if (t < T + 5) {
        const unsigned long long v = s_acc[MAX_GROUPS + t - (T + 2)];
        if (v) (t == T + 3) ? atomicMax(&acc[t], v) : atomicAdd(&acc[t], v);
    } else if (t == T + 5 && s_sq != 0.0) {
        atomicAdd(reinterpret_cast<double*>(&acc[T + 5]), s_sq);
    }
    if (t < T2 + 2 && s_acc2[t]) atomicAdd(&acc[2 * T + 8 + t], s_acc2[t]);
}

// Counting sort of rows by table index (idx in -1..T). counts[g] is the number of rows of group
// g = idx + 1 (classify_rows' acc, or a bincount); every block computes the groups' exclusive
// starts from them (no host round trip), counts its rows per group in shared memory
// (warp-aggregated), takes one range per group by an atomic on fill[g] (zeroed by the caller), and
// places its rows in it. Order within a group is arbitrary, which the passes do not need.
// top >= 0 (the balanced rule): every shared-table row (0 <= idx < T) takes table top, written
// back to idx, and the starts count them there. lift >= 0 (not with top): rows of tables lift ..
// T - 1 take the global-memory path (idx T), likewise.
extern "C" __global__ void bucket_rows(int* __restrict__ idx, const int m, const int T, const int top,
                                       const unsigned long long* __restrict__ counts,
                                       unsigned long long* __restrict__ fill, int* __restrict__ order,
                                       const int lift) {
    __shared__ int s_count[MAX_GROUPS];
    __shared__ long long s_start[MAX_GROUPS];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    for (int t = threadIdx.x; t < T + 2; t += blockDim.x) {   // the counts loaded together (one
        s_count[t] = 0;                                       // thread's loop of dependent loads
        s_start[t] = (long long)counts[t];                    // cost ~T + 2 load latencies)
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        long long shared = 0, lifted = 0, run = 0;
        for (int g = 1; g <= T; ++g) {
            if (top >= 0) shared += s_start[g];
            if (lift >= 0 && g >= lift + 1) lifted += s_start[g];
        }
        for (int g = 0; g < T + 2; ++g) {
            long long c = s_start[g];
            s_start[g] = run;
            if (top >= 0 && g >= 1 && g <= T) c = g == top + 1 ? shared : 0;
            else if (lift >= 0 && g >= lift + 1 && g <= T) c = 0;
            else if (lift >= 0 && g == T + 1) c += lifted;
            run += c;
        }
    }
    __syncthreads();
    int g = 0, pos = 0;
    const unsigned live = __ballot_sync(FULL_MASK, i < m);
    if (i < m) {
        int t = idx[i];
        if (top >= 0 && t >= 0 && t < T && t != top) idx[i] = t = top;
        if (lift >= 0 && t >= lift && t < T) idx[i] = t = T;   // the global-memory path (host: lift_index)
        g = t + 1;
        const unsigned peers = __match_any_sync(live, g);
        const int leader = __ffs(peers) - 1;
        if (lane == leader) pos = atomicAdd(&s_count[g], __popc(peers));
        pos = __shfl_sync(peers, pos, leader) + __popc(peers & ((1u << lane) - 1u));
    }
    __syncthreads();
    if (threadIdx.x < T + 2 && s_count[threadIdx.x])
        s_count[threadIdx.x] = (int)(s_start[threadIdx.x]
                                     + (long long)atomicAdd(&fill[threadIdx.x], (unsigned long long)s_count[threadIdx.x]));
    __syncthreads();
    if (i < m) order[s_count[g] + pos] = i;
}

// ------------------------------------------------------------------ global-memory paths

// The global-memory path runs a batch of rows at a time: row rows[r0 + blockIdx.x] owns slab
// blockIdx.x (B.shape[1] marks, and values in the numeric pass) and gridDim.y blocks that share
// its products as one team of gridDim.y * blockDim.x threads (for_each_product), so a long row
// is not one block's latency chain (skewed-spgemm: 12 rows took 1.75 ms in one block each).
// A slab's marks are stamped with row + 1 and never cleared: rows of later batches reuse them.

// Distinct columns of the batch's rows, added to row_nnz (zeroed for them by the caller), by a
// bitmap of B's columns (`words` words): each block of the row's team sets the bits of its share
// of the products in its own bitmap in shared memory when `in_shared`, then ORs the words into the
// row's bitmap in global memory (bitmaps + blockIdx.x * words, zeroed by the caller) and counts
// the bits it set first (a row of one block counts its own bits, no global bitmap); without
// `in_shared` (B's bitmap past shared memory) the products go to the global bitmap directly.
// A bit a column: R-MAT scale 16's 256 KB int marks a row left the L2 for DRAM.
extern "C" __global__ void symbolic_global(
        const int* __restrict__ Ap, const int* __restrict__ Aj,
        const int* __restrict__ Bp, const int* __restrict__ Bj,
        const long long* __restrict__ csum, const int* __restrict__ rows, const int r0,
        unsigned* __restrict__ bitmaps, const int words, const int in_shared, const long long peak,
        long long* __restrict__ row_nnz) {
    __shared__ int count;
    unsigned* global_bits = bitmaps + (long long)blockIdx.x * words;
    unsigned* bits = in_shared ? reinterpret_cast<unsigned*>(smem) : global_bits;
    const int row = rows[r0 + blockIdx.x];
    // the row's team: its share of the gridDim.y blocks sized for the batch's largest row (`peak`
    // products), so a short row is not spread thin over blocks that each clear and scan a bitmap
    // (H100, R-MAT 17: 8.1 -> 7.35 ms; other products within the run-to-run spread, ~6%)
    const long long products = csum[Ap[row + 1]] - csum[Ap[row]];
    const int team = (int)min((long long)gridDim.y, max(1LL, (products * gridDim.y + peak - 1) / max(peak, 1LL)));
    if ((int)blockIdx.y >= team) return;   // the whole block, before any barrier
    if (in_shared)
        for (int w = threadIdx.x; w < words; w += blockDim.x) bits[w] = 0u;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    int fresh = 0;
    for_each_product<32>(Ap, Aj, Bp, Bj, csum, row, blockIdx.y * blockDim.x + threadIdx.x, team * blockDim.x,
        [&](int k, int, int) {
            // a column seen before is a read, not an atomic (block-dense: 34,596 products a row
            // over 518 columns, 225 words)
            const unsigned bit = 1u << (k & 31);
            if (!(bits[k >> 5] & bit) && !(atomicOr(&bits[k >> 5], bit) & bit) && !in_shared) ++fresh;
            return false;
        });
    if (in_shared) {
        __syncthreads();
        for (int w = threadIdx.x; w < words; w += blockDim.x) {
            const unsigned x = bits[w];
            if (x) fresh += __popc(team == 1 ? x : x & ~atomicOr(&global_bits[w], x));
        }
    }
    atomicAdd(&count, fresh);
    __syncthreads();
    if (threadIdx.x == 0 && count)
        atomicAdd(reinterpret_cast<unsigned long long*>(row_nnz + row), (unsigned long long)count);
}

// Numeric, step 1: every product of the batch's rows added into its slab's dense accumulator.
template <typename T>
__global__ void numeric_global_acc(
        const int* __restrict__ Ap, const int* __restrict__ Aj, const T* __restrict__ Ax,
        const int* __restrict__ Bp, const int* __restrict__ Bj, const T* __restrict__ Bx,
        const long long* __restrict__ csum, const int* __restrict__ rows, const int r0,
        int* __restrict__ marks, T* __restrict__ acc, const long long ncols, const unsigned long long* __restrict__ skip) {
    if (skip && *skip) return;   // a guessed launch words_differ refuted (spgemm._guessed)
    int* mark = marks + (long long)blockIdx.x * ncols;
    T* a = acc + (long long)blockIdx.x * ncols;
    const int row = rows[r0 + blockIdx.x], stamp = row + 1;
    for_each_product<32>(Ap, Aj, Bp, Bj, csum, row, blockIdx.y * blockDim.x + threadIdx.x,
                         gridDim.y * blockDim.x,
        [&](int k, int e, int b) {
            mark[k] = stamp;
            atomicAdd(&a[k], Ax[e] * Bx[b]);
            return false;
        });
}

// Numeric, step 2: the slab's marked columns in order into C, the slab's values zeroed behind;
// a thread scans GLOBAL_SCAN_COLS consecutive columns a step (GLOBAL_SCAN_COLS in spgemm.py too).
// The output of a batch is split into column segments of seg_cols columns (gridDim.y of them a
// row), so a row is not one block scanning all of B's columns (skewed-spgemm: 12 rows of 500k
// columns took 678 us in one block each). global_segment_counts counts each segment's marked
// columns; numeric_global_out's block (row, segment) starts after the row's earlier segments.
extern "C" __global__ void global_segment_counts(
        const int* __restrict__ rows, const int r0, const int* __restrict__ marks,
        const long long ncols, const long long seg_cols, int* __restrict__ seg_counts) {
    __shared__ int warp_sums[33];
    const int* mark = marks + (long long)blockIdx.x * ncols;
    const int stamp = rows[r0 + blockIdx.x] + 1;
    const long long c1 = min(ncols, (blockIdx.y + 1) * seg_cols);
    int n = 0;
    for (long long c = blockIdx.y * seg_cols + threadIdx.x; c < c1; c += blockDim.x) n += mark[c] == stamp;
    int total;
    block_exclusive_sum(n, warp_sums, &total);
    if (threadIdx.x == 0) seg_counts[blockIdx.x * gridDim.y + blockIdx.y] = total;
}

// Sorted output of the batch's rows: each block writes its segment's marked columns in order,
// and zeroes their accumulators for the next batch. Cp null: the one-pass layout (the row at its
// products' offset csum[Ap[row]], its count to row_nnz by the row's last segment).
template <typename T>
__global__ void numeric_global_out(
        const int* __restrict__ rows, const int r0, const int* __restrict__ marks,
        T* __restrict__ acc, const long long ncols, const long long seg_cols,
        const int* __restrict__ seg_counts, const long long* __restrict__ Cp,
        const long long c_base, int* __restrict__ Cj, T* __restrict__ Cx,
        const int* __restrict__ Ap, const long long* __restrict__ csum, long long* __restrict__ row_nnz,
        const unsigned long long* __restrict__ skip) {
    if (skip && *skip) return;   // a guessed launch words_differ refuted (spgemm._guessed)
    __shared__ int warp_sums[33];
    __shared__ long long s_out, s_before;
    const int* mark = marks + (long long)blockIdx.x * ncols;
    T* a = acc + (long long)blockIdx.x * ncols;
    const int row = rows[r0 + blockIdx.x], stamp = row + 1;
    if (threadIdx.x == 0) {
        long long before = 0;
        for (int q = 0; q < (int)blockIdx.y; ++q) before += seg_counts[blockIdx.x * gridDim.y + q];
        s_before = before;
        s_out = row_offset(Cp, c_base, csum, Ap, row) + before;
    }
    __syncthreads();
    long long out = s_out;
    const long long c1 = min(ncols, (blockIdx.y + 1) * seg_cols);
    for (long long c0 = blockIdx.y * seg_cols; c0 < c1; c0 += (long long)blockDim.x * GLOBAL_SCAN_COLS) {
        const long long cb = c0 + (long long)threadIdx.x * GLOBAL_SCAN_COLS;
        int n = 0;
#pragma unroll
        for (int v = 0; v < GLOBAL_SCAN_COLS; ++v) n += cb + v < c1 && mark[cb + v] == stamp;
        int total;
        long long pos = out + block_exclusive_sum(n, warp_sums, &total);
        for (int v = 0; v < GLOBAL_SCAN_COLS && n; ++v) {
            const long long c = cb + v;
            if (c < c1 && mark[c] == stamp) {
                Cj[pos] = (int)c; Cx[pos] = a[c]; a[c] = T(0); ++pos; --n;
            }
        }
        out += total;
    }
    if (row_nnz && threadIdx.x == 0 && blockIdx.y == gridDim.y - 1) row_nnz[row] = s_before + (out - s_out);
}

// The global path by column segments: the block of ticket t (taken from a counter, so a block
// only waits on blocks already running) owns columns [s * seg_cols, (s + 1) * seg_cols) of row
// rows[q], t = q * nseg + s (seg_cols a multiple of 32). It walks all of the row's products,
// SEG_THREADS threads as one team, and keeps those in its columns in shared memory, their sums
// (shared-memory atomics, not the slab path's L2 atomics) and a bitmap of the columns present.
// Its output offset comes from the row's earlier segments by a decoupled look-back: status word
// (count << 2) | 1 once a segment has counted its columns, (inclusive count << 2) | 2 once the
// counts up to it are known. The bitmap, scanned in order, then writes the segment sorted. Every
// segment reads the row's B indices again: spgemm.py takes this path for few segments a row.
// With `b_sorted` (B's rows sorted by column) a segment of a row of at least one A nonzero a warp
// and long B rows reads only its own part of each B row: a warp an A nonzero at a time finds the
// part by two binary searches and its lanes take it (long parts: the whole block).
#define SEG_THREADS 1024
#define SEG_LONG_PART 1024   // entries of a B row's part past which the whole block takes it
#define SEG_LONG_MAX 32      // such parts a block holds (static shared memory: within STATIC_SMEM)

// First position in Bj[b0, b1) (sorted) of a column >= c.
__device__ __forceinline__ int lower_bound_col(const int* __restrict__ Bj, int b0, int b1, const long long c) {
    while (b0 < b1) {
        const int mid = (b0 + b1) >> 1;
        if (Bj[mid] < c) b0 = mid + 1; else b1 = mid;
    }
    return b0;
}

template <typename T>
__global__ void __launch_bounds__(SEG_THREADS) numeric_global_seg(
        const int* __restrict__ Ap, const int* __restrict__ Aj, const T* __restrict__ Ax,
        const int* __restrict__ Bp, const int* __restrict__ Bj, const T* __restrict__ Bx,
        const long long* __restrict__ csum, const int* __restrict__ rows, const int nrows,
        const int nseg, const int seg_cols, unsigned long long* __restrict__ status,
        const long long* __restrict__ Cp, const long long c_base, int* __restrict__ Cj, T* __restrict__ Cx,
        const int b_sorted, long long* __restrict__ row_nnz, const unsigned long long* __restrict__ skip) {
    if (skip && *skip) return;   // a guessed launch words_differ refuted (spgemm._guessed)
    __shared__ int warp_sums[33];
    __shared__ long long s_ticket, s_out;
    T* vals = reinterpret_cast<T*>(smem);
    unsigned* bits = reinterpret_cast<unsigned*>(vals + seg_cols);
    const int words = seg_cols >> 5;
    if (threadIdx.x == 0) s_ticket = (long long)atomicAdd(status + (long long)nrows * nseg, 1ULL);
    for (int c = threadIdx.x; c < seg_cols; c += blockDim.x) vals[c] = T(0);
    for (int w = threadIdx.x; w < words; w += blockDim.x) bits[w] = 0u;
    __syncthreads();
    const int q = (int)(s_ticket / nseg), seg = (int)(s_ticket % nseg);
    const long long lo = (long long)seg * seg_cols;
    const int row = rows[q];
    auto add = [&](const int c, const T v) {
        atomicAdd(&vals[c], v);
        atomicOr(&bits[c >> 5], 1u << (c & 31));
    };
    const int na = Ap[row + 1] - Ap[row];
    // B rows: at least a nonzero of A a warp, and parts of a warp's width on average (the row's
    // products over its nonzeros and segments); shorter parts leave each warp a chain of searches
    // per nonzero of A (skewed-spgemm, 2.8 products a nonzero over 18 segments: 256 -> 1494 us)
    if (b_sorted && na >= (int)(blockDim.x >> 5) &&
        csum[Ap[row + 1]] - csum[Ap[row]] >= 32LL * na * nseg) {
        // parts longer than SEG_LONG_PART are left to the whole block afterwards (up to
        // SEG_LONG_MAX of them), so one long B row does not hold its warp while the others idle
        __shared__ int s_nlong, s_lb0[SEG_LONG_MAX], s_lb1[SEG_LONG_MAX];
        __shared__ T s_la[SEG_LONG_MAX];
        if (threadIdx.x == 0) s_nlong = 0;
        __syncthreads();
        const int lane = threadIdx.x & 31;
        for (int e = Ap[row] + (threadIdx.x >> 5); e < Ap[row + 1]; e += blockDim.x >> 5) {
            const int j = Aj[e];
            const int b0 = lower_bound_col(Bj, Bp[j], Bp[j + 1], lo);
            const int b1 = lower_bound_col(Bj, b0, Bp[j + 1], lo + seg_cols);
            const T a = Ax[e];
            if (b1 - b0 > SEG_LONG_PART) {   // the same on every lane of the warp
                int slot = 0;
                if (lane == 0) slot = atomicAdd(&s_nlong, 1);
                slot = __shfl_sync(FULL_MASK, slot, 0);
                if (slot < SEG_LONG_MAX) {
                    if (lane == 0) { s_lb0[slot] = b0; s_lb1[slot] = b1; s_la[slot] = a; }
                    continue;
                }
            }
            for (int b = b0 + lane; b < b1; b += 32) add((int)(Bj[b] - lo), a * Bx[b]);
        }
        __syncthreads();
        for (int i = 0; i < min(s_nlong, SEG_LONG_MAX); ++i)
            for (int b = s_lb0[i] + threadIdx.x; b < s_lb1[i]; b += blockDim.x) add((int)(Bj[b] - lo), s_la[i] * Bx[b]);
    } else {
        for_each_product<32>(Ap, Aj, Bp, Bj, csum, row, threadIdx.x, blockDim.x,
            [&](int k, int e, int b) {
                const long long c = k - lo;
                if (c >= 0 && c < seg_cols) add((int)c, Ax[e] * Bx[b]);
                return false;
            });
    }
    __syncthreads();
    int w0, w1, total;
    const int n = bitmap_share(bits, words, &w0, &w1);
    const int excl = block_exclusive_sum(n, warp_sums, &total);
    if (threadIdx.x == 0) {
        unsigned long long* st = status + (long long)q * nseg;
        long long before = 0;
        if (seg > 0) {
            atomicExch(st + seg, ((unsigned long long)total << 2) | 1ULL);
            for (int p = seg - 1; p >= 0; --p) {
                unsigned long long v;
                do { v = atomicAdd(st + p, 0ULL); } while ((v & 3ULL) == 0ULL);
                before += (long long)(v >> 2);
                if ((v & 3ULL) == 2ULL) break;
            }
        }
        atomicExch(st + seg, ((unsigned long long)(before + total) << 2) | 2ULL);
        // Cp null (one pass): the last segment writes the row's count
        s_out = row_offset(Cp, c_base, csum, Ap, row) + before;
        if (row_nnz && seg == nseg - 1) row_nnz[row] = before + total;
    }
    __syncthreads();
#if BITMAP_STAGED
    write_bits_staged(bits, w0, w1, s_out + excl, s_out, total, true, Cj, Cx, [](int c) { return c; },
                      [&](int c) { return (int)(lo + c); }, [&](int c) { return vals[c]; });
#else
    write_bits(bits, w0, w1, s_out + excl, lo, Cj, Cx, [&](int c) { return vals[c]; });
#endif
}

// *flag = 1 when words a[0..n) and b[0..n) differ anywhere (one block): spgemm's guessed launch
// path checks the analysis it did not read back against the one it guessed from.
extern "C" __global__ void words_differ(const unsigned long long* __restrict__ a,
                                        const unsigned long long* __restrict__ b, const int n,
                                        unsigned long long* __restrict__ flag) {
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (a[i] != b[i]) *flag = 1ull;
}

// One pass: row i of the upper-bound buffer (Uj, Ux at csum[Ap[i]], Cp[i + 1] - Cp[i] entries) to
// C's exact offsets Cp[i]; compact_entries (below) where rows took the global path, else two
// mappings, chosen by C's mean row length (spgemm.COMPACT_RANGE_BELOW):
// * compact_rows: ``lanes`` (a power of two <= blockDim.x; 32 on the one-pass path) a row, grid-stride,
//   over the rows of ``rows`` (the hybrid's numeric_esc rows, lanes from their widest class) or all. H100 (9643a20), 8 lanes (4 rows a
//   warp) against a warp a row: Poisson 140 against 102 us, uniform 235 against 144.
// * compact_ranges: a block takes COMPACT_ROWS consecutive rows, whose output is one contiguous
//   range of C: thread t writes entries t, t + blockDim.x, ... of it (coalesced whatever the row
//   lengths) and finds each entry's row by a search over the rows' offsets in shared memory.
//   H100 (018dcda): world_highways (~7 entries a row, where a warp a row leaves most lanes idle)
//   116 -> 65 us; Poisson (24) 102 -> 106, uniform (64) 133 -> 158.
template <typename T>
__global__ void compact_rows(const int* __restrict__ Ap, const long long* __restrict__ csum,
                             const long long* __restrict__ Cp, const int* __restrict__ Uj,
                             const T* __restrict__ Ux, const int m, int* __restrict__ Cj, T* __restrict__ Cx,
                             const int* __restrict__ rows, const int lanes) {
    const int lane = threadIdx.x & (lanes - 1);
    const long long stride = (long long)gridDim.x * blockDim.x / lanes;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / lanes; r < m; r += stride) {
        const int i = rows ? rows[r] : (int)r;   // rows: the hybrid's numeric_esc rows only
        const long long src = csum[Ap[i]], dst = Cp[i], len = Cp[i + 1] - dst;
        for (long long q = lane; q < len; q += lanes) { Cj[dst + q] = Uj[src + q]; Cx[dst + q] = Ux[src + q]; }
    }
}

// The last row r in [lo, hi) with Cp[r] <= q, given Cp[lo] <= q < Cp[hi] (C's offsets in global or
// shared memory): compact_ranges and compact_entries.
__device__ __forceinline__ int row_of_entry(const long long* __restrict__ Cp, long long q, int lo, int hi) {
    while (hi - lo > 1) {
        const int mid = lo + ((hi - lo) >> 1);
        if (Cp[mid] <= q) lo = mid; else hi = mid;
    }
    return lo;
}

#define COMPACT_ROWS 256
template <typename T>
__global__ void __launch_bounds__(256) compact_ranges(
        const int* __restrict__ Ap, const long long* __restrict__ csum, const long long* __restrict__ Cp,
        const int* __restrict__ Uj, const T* __restrict__ Ux, const int m, int* __restrict__ Cj,
        T* __restrict__ Cx) {
    __shared__ long long s_dst[COMPACT_ROWS + 1], s_src[COMPACT_ROWS];
    const long long r0 = (long long)blockIdx.x * COMPACT_ROWS;
    const int nr = (int)min((long long)COMPACT_ROWS, m - r0);
    for (int t = threadIdx.x; t <= nr; t += blockDim.x) {
        s_dst[t] = Cp[r0 + t];
        if (t < nr) s_src[t] = csum[Ap[r0 + t]];
    }
    __syncthreads();
    const long long q1 = s_dst[nr];
    int lo = 0;   // the entries a thread visits only move forward: each search starts at the last row
    for (long long q = s_dst[0] + threadIdx.x; q < q1; q += blockDim.x) {
        lo = row_of_entry(s_dst, q, lo, nr);
        const long long src = s_src[lo] + (q - s_dst[lo]);
        Cj[q] = Uj[src];
        Cx[q] = Ux[src];
    }
}

// * compact_entries: a block takes COMPACT_ITEMS * blockDim.x consecutive entries of C, whatever rows
//   hold them: two threads find the rows of its first and last entries (binary search over Cp), each
//   thread the row of its first of COMPACT_ITEMS consecutive entries (a search between those rows),
//   then steps forward (a search again past empty rows); the entries' sources are staged in shared
//   memory and copied coalesced. A long row spreads over as many blocks as its entries fill, where
//   compact_rows gives it one block (skewed's 34 long rows) and compact_ranges the block of its range.
#define COMPACT_ITEMS 8
template <typename T>
__global__ void __launch_bounds__(256) compact_entries(
        const int* __restrict__ Ap, const long long* __restrict__ csum, const long long* __restrict__ Cp,
        const int* __restrict__ Uj, const T* __restrict__ Ux, const int m, const long long nnz,
        int* __restrict__ Cj, T* __restrict__ Cx) {
    __shared__ long long s_src[256 * COMPACT_ITEMS];
    __shared__ int s_rows[2];
    const long long q0 = (long long)blockIdx.x * (blockDim.x * COMPACT_ITEMS);
    const int span = (int)min((long long)blockDim.x * COMPACT_ITEMS, nnz - q0);
    if (threadIdx.x < 2)
        s_rows[threadIdx.x] = row_of_entry(Cp, threadIdx.x ? q0 + span - 1 : q0, 0, m);
    __syncthreads();
    const int r_first = s_rows[0], r_end = s_rows[1] + 1;   // Cp[r_end] > every entry of the block
    const int first = threadIdx.x * COMPACT_ITEMS;
    if (first < span) {
        long long q = q0 + first;
        int r = row_of_entry(Cp, q, r_first, r_end);
        long long start = Cp[r], next = Cp[r + 1], src = csum[Ap[r]];
        const int end = min(first + COMPACT_ITEMS, span);
        for (int t = first; t < end; ++t, ++q) {
            if (q >= next) {   // past row r: the next row, or a search when empty rows lie between
                ++r;
                if (Cp[r + 1] <= q) r = row_of_entry(Cp, q, r, r_end);
                start = Cp[r];
                next = Cp[r + 1];
                src = csum[Ap[r]];
            }
            s_src[t] = src + (q - start);
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < span; t += blockDim.x) {
        const long long s = s_src[t];
        Cj[q0 + t] = Uj[s];
        Cx[q0 + t] = Ux[s];
    }
}

template __global__ void compact_entries<float>(const int*, const long long*, const long long*, const int*,
                                                const float*, int, long long, int*, float*);
template __global__ void compact_entries<double>(const int*, const long long*, const long long*, const int*,
                                                 const double*, int, long long, int*, double*);
template __global__ void compact_ranges<float>(const int*, const long long*, const long long*, const int*,
                                               const float*, int, int*, float*);
template __global__ void compact_ranges<double>(const int*, const long long*, const long long*, const int*,
                                                const double*, int, int*, double*);
template __global__ void compact_rows<float>(const int*, const long long*, const long long*, const int*,
                                             const float*, int, int*, float*, const int*, int);
template __global__ void compact_rows<double>(const int*, const long long*, const long long*, const int*,
                                              const double*, int, int*, double*, const int*, int);
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
#define INSTANTIATE_NUMERIC_ESC(T, W, P)                                                                     \
    template __global__ void numeric_esc<T, W, P>(const int*, const int*, const T*, const int*, const int*,  \
        const T*, const long long*, const int*, int, const long long*, long long, int*, T*, long long*, int,       \
        unsigned long long*);
#define INSTANTIATE_NUMERIC_ESC_CLASS(W, P) INSTANTIATE_NUMERIC_ESC(float, W, P) INSTANTIATE_NUMERIC_ESC(double, W, P)
// spgemm.ESC_CLASSES
INSTANTIATE_NUMERIC_ESC_CLASS(8, 2)
INSTANTIATE_NUMERIC_ESC_CLASS(8, 4)
INSTANTIATE_NUMERIC_ESC_CLASS(16, 4)
INSTANTIATE_NUMERIC_ESC_CLASS(32, 4)
INSTANTIATE_NUMERIC_ESC_CLASS(32, 8)
INSTANTIATE_NUMERIC_ESC_CLASS(32, 16)
template __global__ void symbolic_shared<8>(const int*, const int*, const int*, const int*, const long long*,
        const int*, int, int, int, long long*, int*, int, int*);
template __global__ void symbolic_shared<16>(const int*, const int*, const int*, const int*, const long long*,
        const int*, int, int, int, long long*, int*, int, int*);
template __global__ void symbolic_shared<32>(const int*, const int*, const int*, const int*, const long long*,
        const int*, int, int, int, long long*, int*, int, int*);
template __global__ void numeric_global_acc<float>(const int*, const int*, const float*, const int*, const int*,
        const float*, const long long*, const int*, int, int*, float*, long long, const unsigned long long*);
template __global__ void numeric_global_acc<double>(const int*, const int*, const double*, const int*, const int*,
        const double*, const long long*, const int*, int, int*, double*, long long, const unsigned long long*);
template __global__ void numeric_global_seg<float>(const int*, const int*, const float*, const int*, const int*,
        const float*, const long long*, const int*, int, int, int, unsigned long long*, const long long*, long long,
        int*, float*, int, long long*, const unsigned long long*);
template __global__ void numeric_global_seg<double>(const int*, const int*, const double*, const int*, const int*,
        const double*, const long long*, const int*, int, int, int, unsigned long long*, const long long*, long long,
        int*, double*, int, long long*, const unsigned long long*);
template __global__ void numeric_global_out<float>(const int*, int, const int*, float*, long long, long long,
        const int*, const long long*, long long, int*, float*, const int*, const long long*, long long*,
        const unsigned long long*);
template __global__ void numeric_global_out<double>(const int*, int, const int*, double*, long long, long long,
        const int*, const long long*, long long, int*, double*, const int*, const long long*, long long*,
        const unsigned long long*);
