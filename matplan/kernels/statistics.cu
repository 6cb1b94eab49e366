// The planner's statistics of a CSR operand on the GPU (matplan/core/features.py) and the check of
// its structure (matplan/core/validation.check_csr), in one launch whose figures the host reads
// with one copy of `out` (ST_WORDS words). statistics.py launches it; tests/kernels/
// test_statistics.py holds the host mirror of its arithmetic.
//
// The figures are those of the NumPy formulas bit for bit: integers are exact, and each float sum
// (the squared deviations of the row lengths and of the products per row, the column-spread
// samples) follows NumPy's pairwise summation (numpy's pairwise_sum, from an initial 0): leaves of
// at most 128 values summed with eight accumulators, then each node as left + right. A leaf's
// owner sums it and climbs: the second child to finish a node adds it (last arriver), so every
// node is added once, in NumPy's order, with no barrier.
//
// Phases (mode bits, ST_*), with grid barriers between them (the launch is cooperative when mode
// has ST_ROWS or ST_GEMM):
//  0  A's rows: indptr's first and last entries, rows falling, length min / max / empty rows,
//     the warp lengths in row order, a histogram of lengths (longer rows listed); A's columns:
//     any outside [0, n) (unsigned, as check_csr views them), SpTRANS's longest column; the
//     column-spread samples; SpGEMM: B's rows and columns checked, the products of each row of A
//     (warp tiles of nonzeros, int64 atomics: exact in any order).
//  1  the row lengths' squared deviations' sum; the column spread's sum; the warp lengths after
//     sorting (the histogram's suffix counts and the listed rows' ranks); SpGEMM: products'
//     total, min, max, RBSparse groups, segment sums.
//  2  SpGEMM: the products' squared deviations' sum; the drawn rows (quantiles of the products'
//     running sum, compared as float64 as numpy.searchsorted does).
//  3  SpGEMM: each drawn row's distinct columns among its examined products (a hash set a block).
//
// Inputs may be malformed (a caller vouching with check=False): every read stays inside the
// arrays. Every .cu compiles with plain nvcc -std=c++17 -arch=sm_90.
#include "grid_sync.cuh"

typedef long long ll;
typedef unsigned long long ull;

#define ST_BLOCK 256
#define ST_FULL 0xffffffffu
// modes
#define ST_CHECK 1   // A's structure flags
#define ST_ROWS 2    // row statistics and column spread (SpMV, SpMM, SpGEMM)
#define ST_TRANS 4   // longest row and column (SpTRANS)
#define ST_GEMM 8    // B's flags, products per row, compression sample
// sizes (features.SPREAD_SAMPLES, COMPRESSION_SAMPLES, COMPRESSION_ROW_CAP)
#define ST_HIST 65536      // row lengths counted in a histogram; longer rows are listed
#define ST_HIST_SHARED 2048
#define ST_LONG_CAP 16384  // listed rows at most (more: the host computes the sorted warp length)
#define ST_SAMPLES 65536
#define ST_DRAWS 64
#define ST_ROW_CAP 65536
#define ST_BIAS (1LL << 62)   // min / max kept as unsigned maxima of BIAS - v and BIAS + v
#define ST_PI 3.141592653589793
// out words
#define O_FLAGS_A 0   // 1 indptr[0] != 0, 2 indptr[m] != len(indices), 4 a row falls, 8 a column outside
#define O_PTR0_A 1
#define O_PTRM_A 2
#define O_FLAGS_B 3
#define O_PTR0_B 4
#define O_PTRM_B 5
#define O_MIN 6
#define O_MAX 7
#define O_EMPTY 8
#define O_WARP_BEFORE 9
#define O_WARP_AFTER 10
#define O_LONG 11
#define O_ROW_SS 12    // double
#define O_SPREAD 13    // double
#define O_COL_MAX 14
#define O_PRODUCTS 15
#define O_RCT_MIN 16
#define O_RCT_MAX 17
#define O_RCT_SS 18    // double
#define O_RBS 19       // 6 words
#define O_BAR 25
#define O_DRAWN 26     // ST_DRAWS words each
#define O_DRAWN_P (O_DRAWN + ST_DRAWS)
#define O_DISTINCT (O_DRAWN_P + ST_DRAWS)
#define O_EXAMINED (O_DISTINCT + ST_DRAWS)
#define ST_WORDS (O_EXAMINED + ST_DRAWS)

__device__ __forceinline__ ll ld_int(const void* p, ll i, int wide) {
    return wide ? __ldg((const ll*)p + i) : (ll)__ldg((const int*)p + i);
}

// the index as check_csr views it: unsigned of its own width
__device__ __forceinline__ ull ld_unsigned(const void* p, ll i, int wide) {
    return wide ? (ull)__ldg((const ll*)p + i) : (ull)(unsigned)__ldg((const int*)p + i);
}

__device__ __forceinline__ ll clampll(ll v, ll lo, ll hi) { return v < lo ? lo : (v > hi ? hi : v); }

struct SumOp { __device__ __forceinline__ static ull apply(ull a, ull b) { return a + b; } };
struct MaxOp { __device__ __forceinline__ static ull apply(ull a, ull b) { return b > a ? b : a; } };

template <class Op> __device__ __forceinline__ ull warp_reduce(ull v) {
    for (int o = 16; o; o >>= 1) v = Op::apply(v, __shfl_xor_sync(ST_FULL, v, o));
    return v;
}

// block-wide reduction of v (0 is the identity of both ops), valid in thread 0; every thread calls it
template <class Op> __device__ ull block_reduce(ull v, ull* sh) {
    v = warp_reduce<Op>(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < ST_BLOCK / 32 ? sh[threadIdx.x] : 0ull;
    return threadIdx.x < 32 ? warp_reduce<Op>(v) : v;
}

__device__ __forceinline__ ull warp_max(ull v) { return warp_reduce<MaxOp>(v); }
__device__ ull block_sum(ull v, ull* sh) { return block_reduce<SumOp>(v, sh); }
__device__ ull block_max(ull v, ull* sh) { return block_reduce<MaxOp>(v, sh); }

// block-wide exclusive sum of v (sh: 33 words), *total its total; every thread calls it
__device__ ll block_scan(ll v, ll* sh, ll* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ll incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const ll t = __shfl_up_sync(ST_FULL, incl, o);
        if (lane >= o) incl += t;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const ll w = lane < ST_BLOCK / 32 ? sh[lane] : 0;
        ll s = w;
        for (int o = 1; o < 32; o <<= 1) {
            const ll t = __shfl_up_sync(ST_FULL, s, o);
            if (lane >= o) s += t;
        }
        if (lane < ST_BLOCK / 32) sh[lane] = s - w;
        if (lane == 31) sh[32] = s;
    }
    __syncthreads();
    const ll out = sh[warp] + incl - v;
    *total = sh[32];
    __syncthreads();
    return out;
}


// The last r with indptr[r] <= e in [lo, hi] (indptr[lo] <= e): numpy.searchsorted(indptr, e,
// "right") - 1 within those rows.
__device__ __forceinline__ ll row_of(const void* ptr, int wide, ll e, ll lo, ll hi) {
    while (lo < hi) {
        const ll mid = lo + (hi - lo + 1) / 2;
        if (ld_int(ptr, mid, wide) <= e) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// --- NumPy's pairwise summation ------------------------------------------------------------
// Value sources: the squared deviation of row i's length, of row i's products, a stored sample.
struct RowDev {
    const void* ptr; int wide; double mean;
    __device__ double operator()(ll i) const {
        const double d = __dsub_rn((double)(ld_int(ptr, i + 1, wide) - ld_int(ptr, i, wide)), mean);
        return __dmul_rn(d, d);
    }
};
struct CountDev {
    const ll* v; double mean;
    __device__ double operator()(ll i) const {
        const double d = __dsub_rn((double)__ldcg(v + i), mean);
        return __dmul_rn(d, d);
    }
};
struct Stored {
    const double* v;
    __device__ double operator()(ll i) const { return __ldcg(v + i); }
};

// numpy's pairwise_sum of one leaf (n <= 128 values from lo) by the 8 lanes of a group (j: this
// lane's rank in it, mask: the group's lanes): lane j keeps numpy's accumulator r[j], so its loads
// are independent and the chain one add a step; the result is valid in lane 0.
template <class F>
__device__ double leaf_sum(const F& f, ll lo, ll n, int j, unsigned mask) {
    if (n < 8) {
        double r = -0.0;
        if (j == 0)
            for (ll i = 0; i < n; ++i) r = __dadd_rn(r, f(lo + i));
        return r;
    }
    const ll body = n - (n % 8);
    double r = f(lo + j);
#pragma unroll 4
    for (ll i = 8 + j; i < body; i += 8) r = __dadd_rn(r, f(lo + i));
    // ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), as numpy combines them
    r = __dadd_rn(r, __shfl_down_sync(mask, r, 1, 8));
    r = __dadd_rn(r, __shfl_down_sync(mask, r, 2, 8));
    r = __dadd_rn(r, __shfl_down_sync(mask, r, 4, 8));
    if (j == 0)
        for (ll i = body; i < n; ++i) r = __dadd_rn(r, f(lo + i));
    return r;
}

#define ST_DEPTH 64
#define ST_PW_SPAN (ST_BLOCK / 8)   // windows of 64 positions a block sums a pass: one an 8-lane group

// From a finished node (value v, start at, under `depth` ancestors): the second child to finish
// at each ancestor adds the two (left + right) and climbs on; the root's climber writes *result.
// Ancestors inside the block's span (windows [w0, w0 + ST_PW_SPAN)) count in shared memory.
__device__ void climb(double v, ll at, int depth, const ll* plo, const ll* psplit, const ll* pend, ll w0,
                      double* slot, ull* count, double* result, volatile double* vs_slot, unsigned* s_count) {
    const ll span_lo = 64 * w0, span_hi = 64 * (w0 + ST_PW_SPAN);
    for (int d = depth - 1; d >= 0; --d) {
        if (plo[d] >= span_lo && pend[d] <= span_hi) {   // the parent lies in the span
            vs_slot[(at >> 6) - w0] = v;
            __threadfence_block();
            if (atomicAdd(s_count + ((psplit[d] >> 6) - w0), 1u) == 0u) return;   // the sibling adds it
            __threadfence_block();
            v = __dadd_rn(vs_slot[(plo[d] >> 6) - w0], vs_slot[(psplit[d] >> 6) - w0]);
        } else {
            __stcg(slot + (at >> 6), v);
            __threadfence();
            if (atomicAdd(count + (psplit[d] >> 6), 1ull) == 0ull) return;
            __threadfence();
            v = __dadd_rn(__ldcg(slot + (plo[d] >> 6)), __ldcg(slot + (psplit[d] >> 6)));
        }
        at = plo[d];
    }
    *result = __dadd_rn(0.0, v);
}

// 0 + numpy's pairwise sum of f(0 .. N-1) into *result. A node of n > 128 values splits at
// n2 = n / 2 rounded down to a multiple of 8, so leaves hold 64..128 values (N > 128) and at most
// one starts in each window of 64 positions: the 8-lane group of window w descends to the leaf
// holding the window's last position and owns it where it starts in the window. The finished
// child that arrives second at a node adds the two (left + right) and climbs on: a node's value
// is kept at its start / 64, its count of finished children at its split / 64 (split points
// differ), in shared memory where the node lies in the block's span of ST_PW_SPAN windows (one
// pass), else in slot / count with fenced global atomics (the chain the last leaf climbs to the
// root: shorter by the span's levels). rot: the block that takes the first span (sums run one
// after another start on different blocks). Every thread of the block calls it.
template <class F>
__device__ void pairwise_sum(const F& f, ll N, double* slot, ull* count, double* result, int rot,
                             double* s_slot, unsigned* s_count) {
    const ll windows = (N + 63) / 64;
    const int j = threadIdx.x & 7, g = threadIdx.x >> 3;
    const unsigned mask = 0xffu << (threadIdx.x & 24);
    volatile double* vs_slot = s_slot;
    for (ll w0 = (ll)((blockIdx.x + rot) % gridDim.x) * ST_PW_SPAN; w0 < windows;
         w0 += (ll)gridDim.x * ST_PW_SPAN) {   // block-uniform
        for (int i = threadIdx.x; i < ST_PW_SPAN; i += ST_BLOCK) s_count[i] = 0u;
        __syncthreads();
        const ll w = w0 + g;   // the group's lanes share w
        if (w < windows) {
            const ll q = min(64 * w + 63, N - 1);
            ll lo = 0, len = N, plo[ST_DEPTH], psplit[ST_DEPTH], pend[ST_DEPTH];
            int depth = 0;
            while (len > 128 && depth < ST_DEPTH) {
                ll n2 = len / 2;
                n2 -= n2 % 8;
                plo[depth] = lo;
                psplit[depth] = lo + n2;
                pend[depth] = lo + len;
                ++depth;
                if (q < lo + n2) {
                    len = n2;
                } else {
                    lo += n2;
                    len -= n2;
                }
            }
            // the group owns the leaf where it starts in window w; lane 0 climbs from it
            const double v0 = lo >= 64 * w ? leaf_sum(f, lo, len, j, mask) : 0.0;
            if (lo >= 64 * w && j == 0)
                climb(v0, lo, depth, plo, psplit, pend, w0, slot, count, result, vs_slot, s_count);
        }
        __syncthreads();
    }
}

// --- the kernel ---------------------------------------------------------------------------------
// ws_*: workspace regions (statistics.py: _Layout), zeroed ones marked z.
__global__ void __launch_bounds__(ST_BLOCK) csr_statistics(
        const void* __restrict__ a_ptr, const void* __restrict__ a_idx, long long m, long long n,
        long long a_len, int a_wide_ptr, int a_wide_idx,
        const void* __restrict__ b_ptr, const void* __restrict__ b_idx, long long b_cols, long long b_len,
        int b_wide_ptr, int b_wide_idx, int mode, long long table,
        long long* __restrict__ out,          // z: ST_WORDS
        unsigned long long* __restrict__ hist,   // z: ST_HIST
        unsigned long long* __restrict__ cnt_row,      // z: windows(m) + 1
        unsigned long long* __restrict__ cnt_spread,   // z: windows(ST_SAMPLES) + 1
        unsigned long long* __restrict__ cnt_rct,      // z: windows(m) + 1
        long long* __restrict__ rowct,                 // z: m
        unsigned long long* __restrict__ colcnt,       // z: n
        long long* __restrict__ longs,                 // ST_LONG_CAP
        double* __restrict__ vals,                     // ST_SAMPLES
        double* __restrict__ slot_row, double* __restrict__ slot_spread, double* __restrict__ slot_rct,
        long long* __restrict__ seg,                   // gridDim.x
        unsigned int* __restrict__ tables) {           // ST_DRAWS * table
    __shared__ unsigned int s_hist[ST_HIST_SHARED];
    __shared__ ull s_red[ST_BLOCK / 32];
    __shared__ ll s_scan[33];
    __shared__ ll s_a[ST_BLOCK + 1], s_b[ST_BLOCK + 1];
    __shared__ unsigned long long s_rbs[6];
    __shared__ double s_pw_slot[ST_PW_SPAN];
    __shared__ unsigned s_pw_count[ST_PW_SPAN];

    const int lane = threadIdx.x & 31;
    const ll gtid = (ll)blockIdx.x * ST_BLOCK + threadIdx.x, gstride = (ll)gridDim.x * ST_BLOCK;
    const bool rows = mode & ST_ROWS, trans = mode & ST_TRANS, gemm = mode & ST_GEMM;
    unsigned int* bar = (unsigned int*)(out + O_BAR);
    const ll ptr0 = ld_int(a_ptr, 0, a_wide_ptr), ptrm = ld_int(a_ptr, m, a_wide_ptr);
    const ll nnz = ptrm;   // features take int(A.indptr[-1])

    if (gtid == 0) {
        out[O_PTR0_A] = ptr0;
        out[O_PTRM_A] = ptrm;
        atomicOr((ull*)out + O_FLAGS_A, (ptr0 != 0 ? 1ull : 0ull) | (ptrm != a_len ? 2ull : 0ull));
        if (gemm) {
            const ll b0 = ld_int(b_ptr, 0, b_wide_ptr), bm = ld_int(b_ptr, n, b_wide_ptr);
            out[O_PTR0_B] = b0;
            out[O_PTRM_B] = bm;
            atomicOr((ull*)out + O_FLAGS_B, (b0 != 0 ? 1ull : 0ull) | (bm != b_len ? 2ull : 0ull));
        }
    }
    for (int i = threadIdx.x; i < ST_HIST_SHARED; i += ST_BLOCK) s_hist[i] = 0u;
    if (threadIdx.x < 6) s_rbs[threadIdx.x] = 0ull;
    __syncthreads();

    // ---- phase 0: A's rows (a warp takes 32 consecutive rows: the warp lengths' groups) ----------
    {
        ull mn = 0, mx = 0, empty = 0, before = 0;
        bool falls = false;
        for (ll base = (ll)blockIdx.x * ST_BLOCK + (threadIdx.x & ~31); base < m; base += gstride) {
            const ll i = base + lane;
            const bool live = i < m;
            const ll len = live ? ld_int(a_ptr, i + 1, a_wide_ptr) - ld_int(a_ptr, i, a_wide_ptr) : 0;
            falls |= len < 0;
            if (live && (rows || trans)) {
                mn = max(mn, (ull)(ST_BIAS - len));
                mx = max(mx, (ull)(ST_BIAS + len));
            }
            if (rows) {
                empty += live && len == 0;
                // a group's longest row; the last group is padded with zeros (dead lanes give 0)
                const ull g = warp_max((ull)(len + ST_BIAS));
                if (lane == 0) before += (ull)((ll)g - ST_BIAS);
                if (live && len >= 0) {
                    if (len < ST_HIST_SHARED) {
                        atomicAdd(s_hist + len, 1u);
                    } else if (len < ST_HIST) {
                        atomicAdd(hist + len, 1ull);
                    } else {
                        const ull k = atomicAdd((ull*)out + O_LONG, 1ull);
                        if (k < ST_LONG_CAP) longs[k] = len;
                    }
                }
            }
        }
        if (__syncthreads_or(falls) && threadIdx.x == 0) atomicOr((ull*)out + O_FLAGS_A, 4ull);
        if (rows || trans) {
            mn = block_max(mn, s_red);
            if (threadIdx.x == 0 && mn) atomicMax((ull*)out + O_MIN, mn);
            mx = block_max(mx, s_red);
            if (threadIdx.x == 0 && mx) atomicMax((ull*)out + O_MAX, mx);
        }
        if (rows) {
            empty = block_sum(empty, s_red);
            if (threadIdx.x == 0 && empty) atomicAdd((ull*)out + O_EMPTY, empty);
            before = block_sum(before, s_red);
            if (threadIdx.x == 0 && before) atomicAdd((ull*)out + O_WARP_BEFORE, before);
            __syncthreads();
            for (int i = threadIdx.x; i < ST_HIST_SHARED; i += ST_BLOCK)
                if (s_hist[i]) atomicAdd(hist + i, (ull)s_hist[i]);
        }
    }

    // ---- phase 0: A's columns ----------------------------------------------------------------
    {
        bool outside = false;
        ull longest = 0;
        const ll counted = trans ? clampll(nnz, 0, a_len) : 0;   // bincount(A.indices[:nnz])
        for (ll e = gtid; e < a_len; e += gstride) {
            const ull v = ld_unsigned(a_idx, e, a_wide_idx);
            outside |= v >= (ull)n;
            if (e < counted && v < (ull)n) {
                const ull c = atomicAdd(colcnt + v, 1ull) + 1ull;
                longest = c > longest ? c : longest;
            }
        }
        if (__syncthreads_or(outside) && threadIdx.x == 0) atomicOr((ull*)out + O_FLAGS_A, 8ull);
        if (trans) {
            longest = block_max(longest, s_red);
            if (threadIdx.x == 0 && longest) atomicMax((ull*)out + O_COL_MAX, longest);
        }
    }

    if (gemm) {   // ---- phase 0: B's structure; the products of each row of A ----------------------
        bool falls = false, outside = false;
        for (ll i = gtid; i < n; i += gstride)
            falls |= ld_int(b_ptr, i + 1, b_wide_ptr) < ld_int(b_ptr, i, b_wide_ptr);
        for (ll e = gtid; e < b_len; e += gstride) outside |= ld_unsigned(b_idx, e, b_wide_idx) >= (ull)b_cols;
        const int fb = __syncthreads_or(falls), ob = __syncthreads_or(outside);
        if (threadIdx.x == 0 && (fb || ob)) atomicOr((ull*)out + O_FLAGS_B, (fb ? 4ull : 0ull) | (ob ? 8ull : 0ull));

        // rowct[i] = sum of nnz(B[j, :]) over A's nonzeros (i, j): warp tiles of 32 x steps nonzeros;
        // the lanes' rows rise with their positions, so a segmented sum per step, and the last row's
        // sum carried to the next step, leave one atomic a row a tile. Each step searches its rows
        // (dependent loads): up to 8 steps a tile, fewer where the warps have a tile or two each
        const ll e_lo = clampll(ptr0, 0, a_len), e_hi = clampll(nnz, e_lo, a_len);
        const ll warps = gstride / 32;
        const ll tile = 32 * clampll((e_hi - e_lo + 32 * warps - 1) / (32 * warps), 1, 8);
        for (ll t0 = e_lo + (gtid / 32) * tile; t0 < e_hi; t0 += warps * tile) {   // warp-uniform
            const ll t1 = min(t0 + tile, e_hi);
            ll r_lo = 0, r_hi = 0;
            if (lane == 0) r_lo = row_of(a_ptr, a_wide_ptr, t0, 0, m - 1);
            if (lane == 1) r_hi = row_of(a_ptr, a_wide_ptr, t1 - 1, 0, m - 1);
            r_lo = __shfl_sync(ST_FULL, r_lo, 0);
            r_hi = max(r_lo, __shfl_sync(ST_FULL, r_hi, 1));
            ll carry_row = -1, carry = 0;
            for (ll s = t0; s < t1; s += 32) {
                const ll e = s + lane;
                ll r = r_hi, v = 0;
                if (e < t1) {
                    r = row_of(a_ptr, a_wide_ptr, e, r_lo, r_hi);
                    const ull c = ld_unsigned(a_idx, e, a_wide_idx);
                    if (c < (ull)n) v = ld_int(b_ptr, (ll)c + 1, b_wide_ptr) - ld_int(b_ptr, (ll)c, b_wide_ptr);
                }
                for (int o = 1; o < 32; o <<= 1) {   // inclusive sum within runs of one row
                    const ll pv = __shfl_up_sync(ST_FULL, v, o);
                    const ll pr = __shfl_up_sync(ST_FULL, r, o);
                    if (lane >= o && pr == r) v += pv;
                }
                const ll next = __shfl_down_sync(ST_FULL, r, 1);
                const bool tail = lane == 31 || next != r;
                const ll first_row = __shfl_sync(ST_FULL, r, 0), last_row = __shfl_sync(ST_FULL, r, 31);
                const ll last_sum = __shfl_sync(ST_FULL, v, 31);
                if (carry_row != first_row) {
                    if (lane == 0 && carry_row >= 0 && carry) atomicAdd((ull*)rowct + carry_row, (ull)carry);
                    carry = 0;
                }
                if (first_row == last_row) {
                    carry += last_sum;
                } else {
                    if (tail && lane != 31) {
                        const ll add = v + (r == first_row ? carry : 0);
                        if (add) atomicAdd((ull*)rowct + r, (ull)add);
                    }
                    carry = last_sum;
                }
                carry_row = last_row;
            }
            if (lane == 0 && carry_row >= 0 && carry) atomicAdd((ull*)rowct + carry_row, (ull)carry);
        }
    }

    if (rows && nnz > 0 && n > 0) {   // ---- phase 0: the column-spread samples --------------------
        const ll S = min(nnz, (ll)ST_SAMPLES);
        const double step = S > 1 ? __ddiv_rn((double)(nnz - 1), (double)(S - 1)) : 0.0;
        for (ll s = gtid; s < S; s += gstride) {
            const ll pos = s == S - 1 ? nnz - 1 : (ll)__dmul_rn((double)s, step);   // numpy.linspace
            const ll r = row_of(a_ptr, a_wide_ptr, pos, 0, m) - (ld_int(a_ptr, 0, a_wide_ptr) <= pos ? 0 : 1);
            const ll col = pos < a_len ? ld_int(a_idx, pos, a_wide_idx) : 0;
            vals[s] = fabs(__dsub_rn(__ddiv_rn((double)col, (double)n),
                                     __ddiv_rn(__dadd_rn((double)r, 0.5), (double)m)));
        }
    }
    if (!(rows || gemm)) return;
    grid_sync(bar);

    // ---- phase 1 ---------------------------------------------------------------------------------
    // both sums here (the row lengths' squared deviations need nothing of phase 0), starting on
    // different blocks: their last leaves' climbs to the root overlap
    if (rows && m > 0) {
        const RowDev f{a_ptr, a_wide_ptr, __ddiv_rn((double)(ptrm - ptr0), (double)m)};
        pairwise_sum(f, m, slot_row, cnt_row, (double*)(out + O_ROW_SS), 0, s_pw_slot, s_pw_count);
    }
    if (rows && nnz > 0 && n > 0)
        pairwise_sum(Stored{vals}, min(nnz, (ll)ST_SAMPLES), slot_spread, cnt_spread, (double*)(out + O_SPREAD),
                     (int)(gridDim.x / 2), s_pw_slot, s_pw_count);
    if (rows) {
        const ll K = __ldcg(out + O_LONG);   // rows of length >= ST_HIST
        if (blockIdx.x == 0) {
            // sum over t >= 1 of ceil(C(t) / 32), C(t) the rows of length >= t: each rank 32 g of the
            // lengths sorted (longest first, zeros padding) counts its value once per t <= it. Bins
            // past the longest row are empty and, with no listed rows (K = 0), add nothing: skipped
            const ull top = __ldcg((const ull*)out + O_MAX);
            const ll bins = K > 0 ? ST_HIST : (top ? clampll((ll)top - ST_BIAS + 1, 0, ST_HIST) : 0);
            const ll per = (bins + ST_BLOCK - 1) / ST_BLOCK;
            const ll b0 = min(bins, (ll)threadIdx.x * per), b1 = min(bins, b0 + per);
            ll chunk = 0;
            for (ll b = b0; b < b1; ++b) chunk += (ll)__ldcg(hist + b);
            ll total;
            const ll below = block_scan(chunk, s_scan, &total);
            ll c = K + total - below - chunk;   // rows longer than this chunk's bins
            ull acc = 0;
            for (ll b = b1 - 1; b >= b0; --b) {
                c += (ll)__ldcg(hist + b);
                if (b >= 1) acc += (ull)((c + 31) / 32);
            }
            acc = block_sum(acc, s_red);
            if (threadIdx.x == 0 && acc) atomicAdd((ull*)out + O_WARP_AFTER, acc);
        }
        if (K <= ST_LONG_CAP) {   // t >= ST_HIST: rank 32 g of the listed rows adds len - ST_HIST + 1
            for (ll i = gtid; i < K; i += gstride) {
                const ll L = __ldcg(longs + i);
                ll rank = 0;
                for (ll j = 0; j < K; ++j) {
                    const ll o = __ldcg(longs + j);
                    rank += o > L || (o == L && j < i);
                }
                if (rank % 32 == 0) atomicAdd((ull*)out + O_WARP_AFTER, (ull)(L - ST_HIST + 1));
            }
        }
    }
    ll seg_lo = 0, seg_hi = 0;
    if (gemm) {   // the products per row: total, extremes, RBSparse groups, this block's segment sum
        const ll per = (m + gridDim.x - 1) / gridDim.x;
        seg_lo = min(m, (ll)blockIdx.x * per);
        seg_hi = min(m, seg_lo + per);
        ull sum = 0, mn = 0, mx = 0;
        for (ll i = seg_lo + threadIdx.x; i < seg_hi; i += ST_BLOCK) {
            const ll r = __ldcg(rowct + i);
            sum += (ull)r;
            mn = max(mn, (ull)(ST_BIAS - r));
            mx = max(mx, (ull)(ST_BIAS + r));
            const double alpha = __ddiv_rn((double)r, ST_PI);   // searchsorted(RBS bounds, alpha, "right")
            const int g = (alpha >= 32.0) + (alpha >= 64.0) + (alpha >= 128.0) + (alpha >= 256.0) + (alpha >= 512.0);
            atomicAdd(s_rbs + g, 1ull);
        }
        sum = block_sum(sum, s_red);
        if (threadIdx.x == 0) {
            seg[blockIdx.x] = (ll)sum;
            if (sum) atomicAdd((ull*)out + O_PRODUCTS, sum);
        }
        mn = block_max(mn, s_red);
        if (threadIdx.x == 0 && mn) atomicMax((ull*)out + O_RCT_MIN, mn);
        mx = block_max(mx, s_red);
        if (threadIdx.x == 0 && mx) atomicMax((ull*)out + O_RCT_MAX, mx);
        __syncthreads();
        if (threadIdx.x < 6 && s_rbs[threadIdx.x]) atomicAdd((ull*)out + O_RBS + threadIdx.x, s_rbs[threadIdx.x]);
    }
    if (!gemm) return;
    grid_sync(bar);

    // ---- phase 2: the products' squared deviations; the drawn rows ----------------------------------
    const ll total = __ldcg(out + O_PRODUCTS);
    if (m > 0) {
        const CountDev f{rowct, __ddiv_rn((double)total, (double)m)};
        pairwise_sum(f, m, slot_rct, cnt_rct, (double*)(out + O_RCT_SS), 0, s_pw_slot, s_pw_count);
    }
    if (total > 0 && seg_lo < seg_hi) {
        // csum before this segment; each thread's chunk of it and its running sum
        ull before = 0;
        for (ll b = threadIdx.x; b < blockIdx.x; b += ST_BLOCK) before += (ull)__ldcg(seg + b);
        before = block_sum(before, s_red);
        if (threadIdx.x == 0) s_a[ST_BLOCK] = (ll)before;
        __syncthreads();
        const ll seg_before = s_a[ST_BLOCK];
        const ll per = (seg_hi - seg_lo + ST_BLOCK - 1) / ST_BLOCK;
        const ll c_lo = min(seg_hi, seg_lo + threadIdx.x * per), c_hi = min(seg_hi, c_lo + per);
        ll chunk = 0;
        for (ll i = c_lo; i < c_hi; ++i) chunk += __ldcg(rowct + i);
        ll seg_total;
        const ll at = seg_before + block_scan(chunk, s_scan, &seg_total);
        const double per_draw = __ddiv_rn((double)total, (double)ST_DRAWS);
        for (int k = 0; k < ST_DRAWS; ++k) {
            // row k: the first i with float64(csum[i]) > (k + 0.5) * (total / 64)
            const double target = __dmul_rn((double)k + 0.5, per_draw);
            if (c_lo < c_hi && (double)at <= target && target < (double)(at + chunk)) {
                ll c = at;
                for (ll i = c_lo; i < c_hi; ++i) {
                    const ll r = __ldcg(rowct + i);
                    c += r;
                    if ((double)c > target) {
                        out[O_DRAWN + k] = i;
                        out[O_DRAWN_P + k] = r;
                        break;
                    }
                }
            }
        }
    }
    grid_sync(bar);

    // ---- phase 3: distinct columns among each drawn row's examined products -----------------------
    if (total <= 0) return;
    for (int k = blockIdx.x; k < ST_DRAWS; k += gridDim.x) {
        const ll row = __ldcg(out + O_DRAWN + k);
        if (k > 0 && __ldcg(out + O_DRAWN + k - 1) == row) continue;   // drawn again: counted once
        const ll p = __ldcg(out + O_DRAWN_P + k);
        const ll stride = (p + ST_ROW_CAP - 1) / ST_ROW_CAP;   // every stride-th entry of A's row
        const ll start = ld_int(a_ptr, row, a_wide_ptr);
        const ll length = ld_int(a_ptr, row + 1, a_wide_ptr) - start;
        const ll entries = stride > 0 && length > 0 ? (length + stride - 1) / stride : 0;
        unsigned int* tab = tables + (ll)k * table;
        for (ll i = threadIdx.x; i < table; i += ST_BLOCK) tab[i] = 0u;
        __syncthreads();
        const ll cap = 2LL * ST_ROW_CAP;   // the first 2 x cap products of the subsample
        ll seen = 0, examined = 0;
        ull distinct = 0;
        for (ll c0 = 0; c0 < entries && seen < cap; c0 += ST_BLOCK) {   // block-uniform
            const ll t = c0 + threadIdx.x, e = start + t * stride;
            ll bs = 0, bl = 0;
            if (t < entries && e >= 0 && e < a_len) {
                const ull col = ld_unsigned(a_idx, e, a_wide_idx);
                if (col < (ull)n) {
                    bs = ld_int(b_ptr, (ll)col, b_wide_ptr);
                    bl = max(0LL, ld_int(b_ptr, (ll)col + 1, b_wide_ptr) - bs);
                }
            }
            ll chunk_total;
            const ll ex = block_scan(bl, s_scan, &chunk_total);
            const ll left = max(0LL, cap - seen);   // products still examined
            s_a[threadIdx.x] = min(ex, left);        // where this entry's taken products start
            s_b[threadIdx.x] = bs;
            if (threadIdx.x == 0) s_a[ST_BLOCK] = min(chunk_total, left);
            __syncthreads();
            const ll taken = s_a[ST_BLOCK];
            for (ll v = threadIdx.x; v < taken; v += ST_BLOCK) {
                int lo = 0, hi = ST_BLOCK - 1;   // the last entry starting at or before v
                while (lo < hi) {
                    const int mid = (lo + hi + 1) / 2;
                    if (s_a[mid] <= v) lo = mid; else hi = mid - 1;
                }
                const ll at = s_b[lo] + (v - s_a[lo]);
                if (at < 0 || at >= b_len) continue;
                const ull key = ld_unsigned(b_idx, at, b_wide_idx);
                if (key >= (ull)b_cols) continue;
                const unsigned int stored = (unsigned int)key + 1u;
                ull h = (key * 0x9E3779B97F4A7C15ull) >> 20;
                for (;;) {
                    h &= (ull)(table - 1);
                    const unsigned int prev = atomicCAS(tab + h, 0u, stored);
                    if (prev == 0u) { ++distinct; break; }
                    if (prev == stored) break;
                    ++h;
                }
            }
            examined += taken;
            seen += chunk_total;
            __syncthreads();
        }
        distinct = block_sum(distinct, s_red);
        if (threadIdx.x == 0) {
            out[O_DISTINCT + k] = (ll)distinct;
            out[O_EXAMINED + k] = examined;
        }
        __syncthreads();
    }
}
