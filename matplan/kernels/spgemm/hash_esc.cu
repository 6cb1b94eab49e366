// The sort-based numeric kernel of the one-pass path and the hybrid (kernels/spgemm/numeric.py).
#include "hash_common.cuh"
#include "bitmaps.cuh"

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
// 2^(31 - log2(W * P)) - 1 (rules.esc_max_columns), so no packed product equals EMPTY_KEY.
// Given `window`, a row whose columns span at most W * P skips the sort for esc_window.
// numeric_esc's dense window, for a row whose columns span at most N = W * P (banded rows): the
// row's sums sit at column - lo in the group's N value slots, a bitmap of the columns present in
// its N output slots (as words), and the bitmap, one word a lane, writes the row sorted: no sort
// network. Lanes holding the same column in a round add up in lane order into the lowest of them
// (__match_any_sync), which alone updates the slot: the sums are taken in the products' order,
// deterministic like the sort's. H100, banded-spgemm (289 products, 33 columns a
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
// kernel latency-bound: Nsight Compute on banded);
// at 4 (64 registers, ~280 bytes of spills in float64) banded's numeric_esc went 1041-1047 ->
// 693 us on an H100.
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
    if (skip && *skip) return;   // a guessed launch words_differ refuted (guesses._guessed)
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
        // banded 845 -> 768 us, metis 284 -> 262, skewed 104 -> 99, dragon 386 -> 417)
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

#define INSTANTIATE_NUMERIC_ESC(T, W, P)                                                                     \
    template __global__ void numeric_esc<T, W, P>(const int*, const int*, const T*, const int*, const int*,  \
        const T*, const long long*, const int*, int, const long long*, long long, int*, T*, long long*, int,       \
        unsigned long long*);
#define INSTANTIATE_NUMERIC_ESC_CLASS(W, P) INSTANTIATE_NUMERIC_ESC(float, W, P) INSTANTIATE_NUMERIC_ESC(double, W, P)
// rules.ESC_CLASSES
INSTANTIATE_NUMERIC_ESC_CLASS(8, 2)
INSTANTIATE_NUMERIC_ESC_CLASS(8, 4)
INSTANTIATE_NUMERIC_ESC_CLASS(16, 4)
INSTANTIATE_NUMERIC_ESC_CLASS(32, 4)
INSTANTIATE_NUMERIC_ESC_CLASS(32, 8)
INSTANTIATE_NUMERIC_ESC_CLASS(32, 16)
