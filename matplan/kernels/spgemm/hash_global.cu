// The global-memory paths of the rows too long for any shared table (kernels/spgemm/global_rows.py):
// * symbolic_global: rows too large for any shared table, and the rows of big tables
//   (global_rows.SYMBOLIC_BITMAP_RATIO), count their columns in a bitmap of B's columns (shared memory
//   where it fits), a block or a team of blocks a row.
// * numeric_global_acc + numeric_global_out: their numeric pass by a dense accumulator of
//   B.shape[1] slots in global memory, one slab per row of a batch, several blocks per row; marks
//   are stamped with row + 1 so a slab is never cleared between rows; numeric_global_out scans
//   the columns in order, so its output is sorted.
// * numeric_global_seg: the numeric pass of such rows by column segments that fit in shared
//   memory, a block a segment of a row, reading all of the row's products or (sorted B) its part
//   of each B row (global_rows.py chooses it or the slabs).
#include "hash_common.cuh"
#include "block_scan.cuh"
#include "bitmaps.cuh"

#define GLOBAL_SCAN_COLS 8   // columns of the dense accumulator a thread scans per step (numeric_global)

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
    if (skip && *skip) return;   // a guessed launch words_differ refuted (guesses._guessed)
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
// a thread scans GLOBAL_SCAN_COLS consecutive columns a step (GLOBAL_SCAN_COLS in global_rows.py too).
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
    if (skip && *skip) return;   // a guessed launch words_differ refuted (guesses._guessed)
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
// segment reads the row's B indices again: global_rows.py takes this path for few segments a row.
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
    if (skip && *skip) return;   // a guessed launch words_differ refuted (guesses._guessed)
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
