// TSM2 on tensor cores in float32 by 3xTF32: C (m x k) = A (m x n) . B (n x k), k small.
//
// Why: at k = 32 the FP32 kernels of tsm2.cu and tsm2_async.cu are bound by their FMAs, not by
// reading A (2 k flops per element of A: 64 at k = 32; an H100's FP32 units reach 0.6 of the copy
// bandwidth there, and so does cuBLAS). Tensor cores do the products instead, in TF32 with
// float32 accuracy kept by the 3xTF32 split: a = a_hi + a_lo, a_hi = tf32(a), a_lo = a - a_hi
// (rounded to TF32 with LO = 1; with LO = 0 the mma truncates it), likewise b, and
// a.b ~ a_lo.b_hi + a_hi.b_lo + a_hi.b_hi (the dropped a_lo.b_lo is below 2^-21 |a.b|). The mma
// accumulate in float32 with truncation; with FL = 1 they sum one tile (KC columns) at a time and
// each tile's sums are added into float32 sums rounded to nearest, which keeps the error at the
// FP32 kernels' level. Non-finite values: Inf in A or B makes the split's low part NaN (Inf - Inf),
// and so does a finite value past ~3.4e38 (its high part rounds to Inf), so every element of C
// whose sum meets one comes out of the tensor cores as NaN, and NaN stays NaN. An element of C left
// non-finite is therefore computed again by FP32 FMAs from A and B (fp32_dot, one thread an
// element, at the store): C then has the FP32 kernels' Inf, -Inf and NaN (Inf . 0 is NaN, as in
// IEEE arithmetic) at the cost of a dot product for each such element only. Status and H100
// figures: tsm2_tc.py (1.2-1.3x cuBLAS at k = 32).
//
// mma.sync.m16n8k8 (row.col, tf32 in, f32 accumulators): lane l = 4g + t (g = l / 4, t = l % 4)
// holds A at (row g, k t), (g + 8, t), (g, t + 4), (g + 8, t + 4), B at (k t, n g), (k t + 4, n g)
// and C at (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). The order of the k terms of a sum
// is free, and so is which physical row a fragment row stands for, so each layout maps the
// fragments onto 16-byte loads of A that are fully used sectors:
//   row-major A (A[i*lda + j]): lane (g, t) loads A[row][j + 4t .. j + 4t + 3] of its rows: the
//     logical k (t, t + 4) of k-step s (two k-steps a 16-column step) are columns 4t + 2s and
//     4t + 2s + 1; fragment rows g and g + 8 of tile r are rows 16 r + g and 16 r + 8 + g.
//   column-major A (A[i + j*lda]): lane (g, t) loads rows 4g .. 4g + 3 of a 32-row pair of tiles
//     in columns j + t + 4q (q < 4): logical k (t, t + 4) of k-step s are columns t + 8s and
//     t + 8s + 4; fragment rows (g, g + 8) of tiles 2p and 2p + 1 are rows 32p + 4g + (0, 1) and
//     (2, 3).
// Block: W warps, each RT tiles of 16 rows (RT even for column-major A), NT n-tiles of 8 columns
// of C per pass (passes: ceil(k / 8 NT); A is read once a pass). B is split and laid out in
// fragment order once a call (tsm2_tc_b), then copied into shared memory KC rows at a time by
// 16-byte cp.async, double-buffered (one 16-byte read gives a lane b_hi and b_lo of both its k),
// and each B fragment serves the warp's RT tiles.
// A goes through registers, one 16-column step ahead. Split over n (split-K) as in tsm2.cu: block
// (x, y) takes columns [y * split, (y + 1) * split) of A and writes its partial C at C + y * ldc_s
// (tsm2_split_sum adds the slices in order: deterministic). Rows past m are clamped for loads and
// not stored; columns past n load as zero in A and B. Needs A 16-byte aligned with lda % 4 == 0
// (the launcher checks), sm_80 or later.

template <bool COL> struct TcMap;
template <> struct TcMap<false> {   // row-major A
    // row of (tile r, fragment half h) for lane group g, from the warp's first row
    static __device__ __forceinline__ int row(int r, int h, int g) { return 16 * r + 8 * h + g; }
    // column in a 16-column step of logical k (t + 4 hk) of k-step s
    static __device__ __forceinline__ int col(int t, int s, int hk) { return 4 * t + 2 * s + hk; }
};
template <> struct TcMap<true> {    // column-major A
    static __device__ __forceinline__ int row(int r, int h, int g) { return 32 * (r >> 1) + 4 * g + 2 * (r & 1) + h; }
    static __device__ __forceinline__ int col(int t, int s, int hk) { return t + 8 * s + 4 * hk; }
};

static __device__ __forceinline__ unsigned tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

static __device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Float index in a pass's prepared B (tsm2_tc_b) of B value (row kk, column c of the pass): float4
// ((kk / 16 * 2 + s) * NT + c / 8) * 32 + lane, component h (b_hi), 2 + h (b_lo), where (t, s, h)
// is the k-step slot of kk % 16 (TcMap::col) and lane = 4 (c % 8) + t.
template <bool COL, int NT>
static __device__ __forceinline__ long long b_slot(long long kk, int c) {
    const int w = (int)(kk & 15);
    const int bt = COL ? (w & 3) : (w >> 2), bs = COL ? (w >> 3) : ((w >> 1) & 1), bh = COL ? ((w >> 2) & 1) : (w & 1);
    return ((((kk >> 4) * 2 + bs) * NT + (c >> 3)) * 32 + (c & 7) * 4 + bt) * 4 + bh;
}

// B split and laid out in fragment order once per call, so the main kernel stages it by 16-byte
// cp.async copies (staging it tile by tile with the conversions cost column-major A ~20% at
// k = 32: H100). Bf: ceil(k / 8 NT) passes of n_pad x 8 NT x 2 floats (n_pad: n
// rounded up to the tile); rows past n and columns past k are zeros.
template <bool COL, int NT>
__global__ void tsm2_tc_b(const float* __restrict__ B, long long ldb, int n, int k, long long n_pad,
                          float* __restrict__ Bf) {
    const long long per_pass = n_pad * 8 * NT;
    const long long total = (long long)((k + 8 * NT - 1) / (8 * NT)) * per_pass;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long p = e / per_pass, r = e % per_pass, kk = r / (8 * NT);
        const int c = (int)(r % (8 * NT)), col = (int)p * 8 * NT + c;
        const float x = (kk < n && col < k) ? B[kk * ldb + col] : 0.f;
        const unsigned hi = tf32(x);
        float* out = Bf + 2 * p * per_pass + b_slot<COL, NT>(kk, c);
        out[0] = __uint_as_float(hi);
        out[2] = __uint_as_float(tf32(x - __uint_as_float(hi)));
    }
}

// The FP32 value of C[row][c] over this slice's n columns, sequential FMAs from A and the
// original B (row-major, ldb): the store's path for elements the tensor cores left non-finite.
// Out of line, so the main loop's registers do not pay for it.
template <bool COL>
static __device__ __noinline__ float fp32_dot(const float* __restrict__ A, long long lda,
                                              const float* __restrict__ B, long long ldb,
                                              long long row, int c, int n) {
    float s = 0.f;
#pragma unroll 8
    for (int j = 0; j < n; ++j) s = fmaf(COL ? A[row + j * lda] : A[row * lda + j], B[j * ldb + c], s);
    return s;
}

static __device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(a), "l"(gmem) : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
static __device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

template <bool COL, int NT, int W, int RT, int KC, int MB, int D, int LO, int FL = 0>
__global__ void __launch_bounds__(W * 32, MB)
tsm2_tf32x3(const float* __restrict__ A, long long lda, const float4* __restrict__ Bf, long long bf_pass,
            const float* __restrict__ B, long long ldb, float* __restrict__ C, long long ldc_r, long long ldc_c,
            int m, int n, int k, int split, long long ldc_s)
{
    static_assert(KC % 16 == 0 && NT >= 1 && NT <= 4 && RT >= 1, "KC: multiple of 16; NT: 1..4");
    static_assert(D >= 1 && (KC / 16) % D == 0, "D (16-column steps of A in flight) must divide KC / 16");
    static_assert(!COL || RT % 2 == 0, "column-major A: RT even (a 16-byte load spans two tiles)");
    static_assert(RT * NT * 4 <= 32, "a lane's RT x NT x 4 sums must fit the 32 bits of its non-finite mask");
    constexpr int T = W * 32;
    constexpr int NL = 2 * RT;                          // 16-byte loads of A a lane makes a step
    constexpr int TF4 = KC / 8 * NT * 32;               // float4 of a tile of prepared B
    __shared__ __align__(16) float4 Bs[2][KC / 8 * NT * 32];
    {                                                  // split over j: this block's slice of n
        const long long jb = (long long)blockIdx.y * split;
        A += COL ? jb * lda : jb; Bf += jb / 8 * NT * 32; C += blockIdx.y * ldc_s;
        n = (int)((long long)n - jb < split ? (long long)n - jb : split);
    }
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const long long r0 = ((long long)blockIdx.x * W + (tid >> 5)) * (16 * RT);
    // the rows a lane loads (row-major: one a load; column-major: the first of 4), clamped into A
    // (32-bit row numbers, not pointers: registers are what limits this kernel)
    int arow[NL];
    unsigned vec_rows = 0;                              // column-major: bit l, all 4 rows inside A
#pragma unroll
    for (int l = 0; l < NL; ++l) {
        const long long r = r0 + (COL ? TcMap<true>::row(2 * (l >> 2), 0, g) : TcMap<false>::row(l >> 1, l & 1, g));
        vec_rows |= (r + 3 < m ? 1u : 0u) << l;
        arow[l] = (int)(r < m ? r : (long long)m - 1);
    }
    // load l of the 16-column step at column j: row-major, row l of the lane at columns j + 4t..;
    // column-major, rows of pair l / 4 at column j + t + 4 (l % 4)
    auto load_a = [&](float (&o)[NL][4], long long j) {
#pragma unroll
        for (int l = 0; l < NL; ++l) {
            if (COL) {
                const long long c = j + t + 4 * (l & 3);
                if (c < n && (vec_rows >> l & 1u)) {
                    const float4 x = __ldcs(reinterpret_cast<const float4*>(A + arow[l] + c * lda));
                    o[l][0] = x.x; o[l][1] = x.y; o[l][2] = x.z; o[l][3] = x.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const long long r = r0 + 32 * (l >> 2) + 4 * g + e;
                        o[l][e] = c < n ? __ldcs(A + (r < m ? r : (long long)m - 1) + c * lda) : 0.f;
                    }
                }
            } else {
                const long long c = j + 4 * t;
                const float* p = A + (long long)arow[l] * lda + c;
                if (c + 3 < n) {
                    const float4 x = __ldcs(reinterpret_cast<const float4*>(p));
                    o[l][0] = x.x; o[l][1] = x.y; o[l][2] = x.z; o[l][3] = x.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[l][e] = c + e < n ? __ldcs(p + e) : 0.f;
                }
            }
        }
    };
    // fragment value i (a0..a3) of tile r, k-step s, from a step's loads
    auto a_at = [](const float (&o)[NL][4], int r, int s, int i) -> float {
        const int h = i & 1, hk = i >> 1;
        return COL ? o[4 * (r >> 1) + 2 * s + hk][2 * (r & 1) + h] : o[2 * r + h][2 * s + hk];
    };
    for (int c0 = 0; c0 < k; c0 += 8 * NT) {
        // FL: the mma accumulate a tile's products only, added to sum (float32 FADD, rounded to
        // nearest) after each tile: the tensor cores' accumulation error then stays a tile's
        float acc[RT][NT][4], sum[FL ? RT : 1][FL ? NT : 1][4];
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[r][nt][i] = 0.f;
#pragma unroll
        for (int r = 0; r < (FL ? RT : 1); ++r)
#pragma unroll
            for (int nt = 0; nt < (FL ? NT : 1); ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) sum[r][nt][i] = 0.f;
        const float4* bf = Bf + (long long)(c0 / (8 * NT)) * bf_pass;   // this pass's prepared B
        auto stage_b = [&](float4* bs, long long j0) {   // the tile at column j0, by cp.async
            const float4* src = bf + j0 / 8 * NT * 32;
#pragma unroll
            for (int q = tid; q < TF4; q += T) cp_async16(bs + q, src + q);
            cp_async_commit();
        };
        float anext[D][NL][4];                          // step u of a tile in slot u % D
        stage_b(Bs[0], 0);
#pragma unroll
        for (int d = 0; d < D; ++d) load_a(anext[d], 16 * d);
        cp_async_wait_all();
        __syncthreads();

        int buf = 0;
        for (int j0 = 0; j0 < n; j0 += KC, buf ^= 1) {
            const float4* bs = Bs[buf];
            // the next tile of B into the other buffer (last read before the previous barrier)
            if (j0 + KC < n) stage_b(Bs[buf ^ 1], (long long)j0 + KC);
#pragma unroll 1
            for (int u0 = 0; u0 < KC / 16; u0 += D) {
#pragma unroll
                for (int d = 0; d < D; ++d) {
                    const int jj = 16 * (u0 + d);
                    float acur[NL][4];
#pragma unroll
                    for (int l = 0; l < NL; ++l)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acur[l][e] = anext[d][l][e];
                    load_a(anext[d], (long long)j0 + jj + 16 * D);   // D steps ahead
#pragma unroll
                    for (int s = 0; s < 2; ++s) {
                        unsigned ahi[RT][4], alo[RT][4];
#pragma unroll
                        for (int r = 0; r < RT; ++r)
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                const float x = a_at(acur, r, s, i);
                                ahi[r][i] = tf32(x);
                                const float lo = x - __uint_as_float(ahi[r][i]);   // exact
                                alo[r][i] = LO ? tf32(lo) : __float_as_uint(lo);  // LO = 0: the mma truncates it
                            }
                        unsigned bh[NT][2], bl[NT][2];
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            const float4 b = bs[((jj / 16 * 2 + s) * NT + nt) * 32 + lane];
                            bh[nt][0] = __float_as_uint(b.x); bh[nt][1] = __float_as_uint(b.y);
                            bl[nt][0] = __float_as_uint(b.z); bl[nt][1] = __float_as_uint(b.w);
                        }
                        // each of the three products over all RT x NT accumulators before the next
                        // (small terms first): RT x NT independent mma between two on one accumulator
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                            for (int r = 0; r < RT; ++r) mma_tf32(acc[r][nt], alo[r], bh[nt][0], bh[nt][1]);
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                            for (int r = 0; r < RT; ++r) mma_tf32(acc[r][nt], ahi[r], bl[nt][0], bl[nt][1]);
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                            for (int r = 0; r < RT; ++r) mma_tf32(acc[r][nt], ahi[r], bh[nt][0], bh[nt][1]);
                    }
                }
            }
            if (FL) {
#pragma unroll
                for (int r = 0; r < RT; ++r)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            sum[FL ? r : 0][FL ? nt : 0][i] += acc[r][nt][i];
                            acc[r][nt][i] = 0.f;
                        }
            }
            cp_async_wait_all();
            __syncthreads();
        }
        unsigned bad = 0;                               // bit (r NT + nt) 4 + i: left non-finite
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const long long row = r0 + TcMap<COL>::row(r, i >> 1, g);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int c = c0 + nt * 8 + 2 * t + (i & 1);
                    const float v = FL ? sum[FL ? r : 0][FL ? nt : 0][i] : acc[r][nt][i];
                    bad |= (isfinite(v) ? 0u : 1u) << ((r * NT + nt) * 4 + i);
                    if (row < m && c < k) C[row * ldc_r + (long long)c * ldc_c] = v;
                }
            }
        // the elements whose sums met Inf or NaN (or a value whose high part rounded to Inf), again
        // by FP32 FMAs: a cold path after the stores, so the sums are no longer live
#pragma unroll 1
        for (; bad; bad &= bad - 1) {
            const int b = __ffs(bad) - 1, r = b / (4 * NT), nt = b / 4 % NT, i = b % 4;
            const long long row = r0 + TcMap<COL>::row(r, i >> 1, g);
            const int c = c0 + nt * 8 + 2 * t + (i & 1);
            if (row < m && c < k)   // this slice's rows of B: from row blockIdx.y * split
                C[row * ldc_r + (long long)c * ldc_c] =
                    fp32_dot<COL>(A, lda, B + (long long)blockIdx.y * split * ldb, ldb, row, c, n);
        }
        __syncthreads();                                // the next pass refills buffer 0
    }
}

#define INSTANTIATE_TF32X3(COL, NT, W, RT, MB, D, LO, FL)                                               \
    template __global__ void tsm2_tf32x3<COL, NT, W, RT, 64, MB, D, LO, FL>(const float*, long long,       \
        const float4*, long long, const float*, long long, float*, long long, long long, int, int, int, int,  \
        long long);
#define INSTANTIATE_TF32X3_NT(W, RT, MB, D, LO, FL) INSTANTIATE_TF32X3(false, 2, W, RT, MB, D, LO, FL)     \
    INSTANTIATE_TF32X3(true, 2, W, RT, MB, D, LO, FL) INSTANTIATE_TF32X3(false, 4, W, RT, MB, D, LO, FL)  \
    INSTANTIATE_TF32X3(true, 4, W, RT, MB, D, LO, FL)
// tsm2_tc.VARIANTS (W, RT, MB, D, LO, FL) with NT 2 and 4
INSTANTIATE_TF32X3_NT(8, 2, 2, 1, 0, 1)
INSTANTIATE_TF32X3_NT(8, 2, 2, 2, 0, 1)
// row-major only (RT = 1: one tile a warp, so more 16-column steps of A fit in flight)
INSTANTIATE_TF32X3(false, 2, 8, 1, 2, 4, 0, 1) INSTANTIATE_TF32X3(false, 4, 8, 1, 2, 4, 0, 1)
INSTANTIATE_TF32X3(false, 2, 8, 1, 2, 2, 0, 1) INSTANTIATE_TF32X3(false, 4, 8, 1, 2, 2, 0, 1)
template __global__ void tsm2_tc_b<false, 2>(const float*, long long, int, int, long long, float*);
template __global__ void tsm2_tc_b<true, 2>(const float*, long long, int, int, long long, float*);
template __global__ void tsm2_tc_b<false, 4>(const float*, long long, int, int, long long, float*);
template __global__ void tsm2_tc_b<true, 4>(const float*, long long, int, int, long long, float*);
