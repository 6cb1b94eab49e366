// TSM2 with A streamed through shared memory by cp.async (issue #5).
//
// C (m x k) = A (m x n) . B (n x k), k small. A row-major (A[i, j] at A[i*lda + j]):
// tsm2_rowmajor_async, described below; column-major (A[i + j*lda]): tsm2_colmajor_async, the
// same body with its differences stated at tsm2_async_body.
//
// Why: tsm2_rowmajor (tsm2.cu) keeps the loads of A in flight in registers, which caps the
// bytes of A in flight per SM (about 16 KB/SM: 0.74-0.78 of the copy bandwidth at k = 16 on an
// H100). Here A goes global -> shared memory by 16-byte cp.async copies (no registers held while
// in flight), S stages deep, so (S - 1) tiles per block, i.e. tens of KB per SM, are in flight.
//
// Block: NT = 32 * WR * WJ threads own a band of R = WR * TR * RR consecutive rows of A and one
// pass of KP = TC * CC columns of C (TC = 32 / TR). The band walks n in tiles of R x TJ elements
// of A plus the TJ x KP slice of B that multiplies them, both copied by cp.async into stage
// t % S of dynamic shared memory; S - 1 tiles are issued ahead (one commit group per tile, one
// barrier per tile).
//   A stage: R rows of TJ elements, unpadded, so each 128-byte line of a row lands in one
//            128-byte line of shared memory; the 16-byte chunks of row r sit at chunk ^ (r & SWM)
//            (XOR swizzle, V = 16 / sizeof(T) elements a chunk), so the rows one read takes are
//            spread over the bank groups and reads are conflict-free. The earlier 16-byte pad
//            between rows made every line's copy straddle two shared-memory lines: ncu counted
//            13.5 M L2 sectors for 9.5 M here (n = 8192 float32 k = 16, H100).
//   B stage: TJ rows of KP elements (natural layout; columns past k and rows past n zero-filled).
// Compute: warp (wr, wj) takes rows wr*TR*RR .. + TR*RR - 1 of the band and columns
// [wj*TJ/WJ, (wj+1)*TJ/WJ) of the tile; lane (tr, tc) = (lane % TR, lane / TR) owns rows
// wr*TR*RR + i*TR + tr (i < RR, interleaved: the TR lanes of one read hit consecutive rows) and
// columns tc*CC .. tc*CC + CC - 1 of the pass. Per V columns of A: RR 16-byte shared reads of A,
// V * CC / V 16-byte shared reads of B (all lanes of a tc read the same address: broadcast), and
// RR * CC * V FMAs into RR * CC register accumulators. Shared-memory wavefronts per byte of A
// consumed are about (RR * ceil(TR*16/128) + CC) * 128 / (TR * RR * 16) (1.5-3 for the presets),
// well under the H100's ~8.8 (128 B/clk/SM shared vs ~14.5 B/clk/SM of HBM bandwidth).
// After the walk the WJ warps' partial sums are added in a fixed order through shared memory
// (deterministic) and written to C with strides (ldc_r, ldc_c); rows past m and columns past k
// are not stored.
//
// A is read from global memory once per pass (passes = ceil(k / KP)); the passes of a band are
// adjacent block ids (blockIdx.x = band * passes + pass), so they run at about the same time and
// share A through L2 when k > KP.
// Requirements (the launcher checks them): A 16-byte aligned and lda * sizeof(T) % 16 == 0 (every
// row starts 16-byte aligned); rows past m and columns past n are zero-filled by cp.async with
// src-size 0 (or the bytes left in the row), so nothing outside A or B is read. B: row stride
// ldb, chunks of BV elements (BV * sizeof(T) in {4, 8, 16}; BV > 1 needs B, ldb and KP aligned to
// BV elements).
// MB: the minimum resident blocks per SM asked of the compiler (__launch_bounds__), which caps
// the registers per thread at 65536 / (MB * NT): the fully unrolled tile loop otherwise hoists
// many shared-memory reads and takes 120-250 registers.
// cp.async by inline PTX (sm_80+), no headers: compiles with NVRTC (CuPy RawModule) and plain nvcc.

namespace tsm2a {

__host__ __device__ constexpr int low_pow2(int x) { return x & -x; }   // largest power of two dividing x

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// cp.async of BYTES bytes, of which src_bytes (0..BYTES) are read and the rest zero-filled.
template <int BYTES> struct CpAsync;
template <> struct CpAsync<16> {   // .cg: L2 only (A is streamed once)
    static __device__ __forceinline__ void go(unsigned dst, const void* src, int src_bytes) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
    }
};
// A whole 16-byte chunk (no src-size operand): the fast path of a tile wholly inside A or B.
// A's copies (L1 false: L2 only) ask L2 to fetch the chunk's whole 128-byte line (.L2::128B):
// row-major A ran 1-2% faster back to back, column-major the same (H100;
// .L2::256B about the same as 128B).
template <bool L1> __device__ __forceinline__ void cp_async16_full(unsigned dst, const void* src) {
    if constexpr (L1) asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
    else asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
}
template <> struct CpAsync<8> {
    static __device__ __forceinline__ void go(unsigned dst, const void* src, int src_bytes) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
    }
};
template <> struct CpAsync<4> {
    static __device__ __forceinline__ void go(unsigned dst, const void* src, int src_bytes) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
    }
};
// B chunks of 16 bytes go through L1 too (.ca): neighbouring blocks read the same B rows.
template <int BYTES> struct CpAsyncB : CpAsync<BYTES> {};
template <> struct CpAsyncB<16> {
    static __device__ __forceinline__ void go(unsigned dst, const void* src, int src_bytes) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
    }
};

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_prior() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// 16 bytes of shared memory (V elements), 16-byte aligned by construction.
template <typename T> struct Lds16;
template <> struct Lds16<float> {
    static __device__ __forceinline__ void go(const float* p, float* o) {
        const float4 x = *reinterpret_cast<const float4*>(p); o[0] = x.x; o[1] = x.y; o[2] = x.z; o[3] = x.w;
    }
};
template <> struct Lds16<double> {
    static __device__ __forceinline__ void go(const double* p, double* o) {
        const double2 x = *reinterpret_cast<const double2*>(p); o[0] = x.x; o[1] = x.y;
    }
};

}  // namespace tsm2a

// Elements of dynamic shared memory the kernel uses (the launcher computes the same number).
// COL (column-major A): an A stage holds TJ columns of R rows, each column's R elements
// contiguous (AS = R: the lanes of a read take consecutive 16-byte chunks of one column).
template <typename T, int WR, int WJ, int TR, int RR, int CC, int TJ, int S, bool COL = false>
struct Tsm2AsyncShape {
    static constexpr int V = 16 / (int)sizeof(T);
    static constexpr int TC = 32 / TR;
    static constexpr int KP = TC * CC;
    static constexpr int R = WR * TR * RR;
    static constexpr int AS = COL ? R : TJ;
    static constexpr int A_STAGE = COL ? TJ * AS : R * AS;
    static constexpr int B_STAGE = TJ * KP;
    static constexpr int STAGE = A_STAGE + B_STAGE;
    static constexpr int RED = WJ > 1 ? WJ * R * KP : 0;
    static constexpr int ELEMS = S * STAGE > RED ? S * STAGE : RED;
};

// The kernel body for row-major A (COL false) and column-major A (COL true, A[i, j] at
// A[i + j*lda]; tsm2_colmajor_async). Column-major differences: an A tile is TJ columns of R
// rows, copied as 16-byte chunks down each column; lane (tr, tc) owns rows in RR / V groups of
// V consecutive rows (row wr*TR*RR + (g*TR + tr)*V + v), and per column j of the tile reads
// RR / V 16-byte chunks of A and CC / V of B (broadcast) for RR * CC FMAs.
template <bool COL, typename T, int WR, int WJ, int TR, int RR, int CC, int TJ, int S, int BV>
__device__ __forceinline__ void
tsm2_async_body(const T* __restrict__ A, long long lda, const T* __restrict__ B, long long ldb,
                T* __restrict__ C, long long ldc_r, long long ldc_c, int m, int n, int k, int passes)
{
    using Sh = Tsm2AsyncShape<T, WR, WJ, TR, RR, CC, TJ, S, COL>;
    constexpr int NT = 32 * WR * WJ;
    constexpr int V = Sh::V, KP = Sh::KP, R = Sh::R, AS = Sh::AS;
    constexpr int A_STAGE = Sh::A_STAGE, STAGE = Sh::STAGE;
    constexpr int JW = TJ / WJ;                  // columns of a tile per warp
    constexpr int CPR = COL ? R / V : TJ / V;    // 16-byte chunks per row (COL: per column) of an A tile
    constexpr int ACH = COL ? TJ * CPR : R * CPR;  // chunks of an A tile
    constexpr int AN = (ACH + NT - 1) / NT;      // A chunks per thread per tile
    constexpr int BPR = KP / BV;                 // chunks per row of a B tile
    constexpr int BCH = TJ * BPR;
    constexpr int BN = (BCH + NT - 1) / NT;
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "float or double");
    static_assert(32 % TR == 0 && TR >= 1, "TR: a divisor of 32");
    static_assert(CC % V == 0, "CC: a multiple of 16 bytes of elements");
    static_assert(COL || TJ % (WJ * V) == 0, "TJ: a multiple of WJ * V");
    static_assert(!COL || (RR % V == 0 && TJ % WJ == 0), "column-major: RR a multiple of V, TJ of WJ");
    static_assert(S >= 2 && S <= 8, "S: 2..8 stages");
    static_assert(KP % BV == 0 && (BV * (int)sizeof(T) == 4 || BV * (int)sizeof(T) == 8 || BV * (int)sizeof(T) == 16),
                  "BV: B chunk of 4, 8 or 16 bytes dividing KP");

    extern __shared__ __align__(16) unsigned char tsm2a_smem[];
    T* const smem = reinterpret_cast<T*>(tsm2a_smem);

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int wr = warp / WJ, wj = warp % WJ;
    const int tr = lane % TR, tc = lane / TR;
    const long long band = blockIdx.x / passes;
    const int c0 = (int)(blockIdx.x % passes) * KP;
    const long long row0 = band * R;
    const int ntiles = (int)(((long long)n + TJ - 1) / TJ);

    // Fast paths (most tiles): a tile wholly inside A (its B slice wholly inside B) is copied in
    // whole 16-byte chunks at this thread's first chunk's addresses moved by constant steps, so a
    // copy costs an address add and the cp.async. The general path works out each chunk's row,
    // column and bytes: ~20 instructions a copy, a third of the issue slots at float32 k = 16.
    // A thread's chunks s = 0.. are ASTEP rows (row-major) or columns (column-major) apart when
    // NT is a multiple of CPR, its B chunks BSTEP rows apart when NT is a multiple of BPR.
    constexpr bool FAST_A = NT % CPR == 0, FAST_B = NT % BPR == 0 && BV * (int)sizeof(T) == 16;
    constexpr int ASTEP = FAST_A ? NT / CPR : 1, BSTEP = FAST_B ? NT / BPR : 1;
    const unsigned smem0 = tsm2a::smem_u32(smem);
    const bool band_full = row0 + R <= m, b_cols_full = c0 + KP <= k;
    const int a_r = tid / CPR, a_ch = tid % CPR;   // chunk 0: row (column-major: column), chunk of it
    const T* const a_g0 = COL ? A + (long long)a_r * lda + row0 + a_ch * V : A + (row0 + a_r) * lda + a_ch * V;
    const long long a_gt = COL ? (long long)TJ * lda : (long long)TJ;        // tile t -> t + 1
    // Row-major swizzle: chunk ch of stage row r at ch ^ (r & SWM). SWM + 1 is the largest power
    // of two <= min(8, TR) dividing the chunks per row (and ASTEP), so the mask is the same for a
    // lane's RR rows (TR apart) and a thread's copies (ASTEP rows apart): one XOR per address.
    // The 8 lanes of a 16-byte shared read's phase take min(8, TR) rows: distinct bank groups.
    constexpr int SWM = COL ? 0 : tsm2a::low_pow2(8 | TR | CPR | (FAST_A ? ASTEP : 8)) - 1;
    const int a_x = COL ? a_ch : a_ch ^ (a_r & SWM);
    const unsigned a_s0 = (unsigned)((a_r * AS + a_x * V) * (int)sizeof(T));
    const int b_r = tid / BPR, b_c = (tid % BPR) * BV;
    const T* const b_g0 = B + (long long)b_r * ldb + c0 + b_c;
    const unsigned b_s0 = (unsigned)((A_STAGE + b_r * KP + b_c) * (int)sizeof(T));

    auto issue = [&](int t) {
        if (t < ntiles) {
            T* const sa = smem + (t % S) * STAGE;
            T* const sb = sa + A_STAGE;
            const unsigned st = smem0 + (unsigned)((t % S) * STAGE * (int)sizeof(T));
            const long long j0 = (long long)t * TJ;
            const bool cols_full = j0 + TJ <= n;
            if (FAST_A && band_full && cols_full) {
                const T* const ga = a_g0 + t * a_gt;
#pragma unroll
                for (int s = 0; s < AN; ++s)
                    if (ACH % NT == 0 || tid + s * NT < ACH)
                        tsm2a::cp_async16_full<false>(st + a_s0 + (unsigned)(s * ASTEP * AS * (int)sizeof(T)),
                                                      ga + (long long)s * ASTEP * lda);
            } else {
#pragma unroll
                for (int s = 0; s < AN; ++s) {       // chunk e: row e / CPR, 16-byte chunk e % CPR of it
                    const int e = tid + s * NT;
                    if (ACH % NT == 0 || e < ACH) {
                        if constexpr (COL) {             // chunk e: column e / CPR, rows (e % CPR) * V ..
                            const int jj = e / CPR, ch = e % CPR;
                            const long long j = j0 + jj;
                            const long long row = row0 + (long long)ch * V;
                            const long long left = (long long)m - row;
                            const int bytes = (j < n && left > 0) ? (left >= V ? 16 : (int)left * (int)sizeof(T)) : 0;
                            tsm2a::CpAsync<16>::go(tsm2a::smem_u32(sa + jj * AS + ch * V),
                                                   bytes ? (const void*)(A + j * lda + row) : (const void*)A, bytes);
                        } else {
                            const int r = e / CPR, ch = e % CPR;
                            const long long row = row0 + r;
                            const long long j = j0 + ch * V;
                            const long long left = (long long)n - j;
                            const int bytes = (row < m && left > 0) ? (left >= V ? 16 : (int)left * (int)sizeof(T)) : 0;
                            tsm2a::CpAsync<16>::go(tsm2a::smem_u32(sa + r * AS + (ch ^ (r & SWM)) * V),
                                                   bytes ? (const void*)(A + row * lda + j) : (const void*)A, bytes);
                        }
                    }
                }
            }
            if (FAST_B && cols_full && b_cols_full) {
                const T* const gb = b_g0 + j0 * ldb;
#pragma unroll
                for (int s = 0; s < BN; ++s)
                    if (BCH % NT == 0 || tid + s * NT < BCH)
                        tsm2a::cp_async16_full<true>(st + b_s0 + (unsigned)(s * BSTEP * KP * (int)sizeof(T)),
                                                     gb + (long long)s * BSTEP * ldb);
            } else {
#pragma unroll
                for (int s = 0; s < BN; ++s) {
                    const int e = tid + s * NT;
                    if (BCH % NT == 0 || e < BCH) {
                        const int jj = e / BPR, cc = (e % BPR) * BV;
                        const long long j = j0 + jj;
                        const int c = c0 + cc;
                        int cnt = k - c;
                        cnt = (j < n && cnt > 0) ? (cnt < BV ? cnt : BV) : 0;
                        tsm2a::CpAsyncB<BV * (int)sizeof(T)>::go(tsm2a::smem_u32(sb + jj * KP + cc),
                                                                cnt ? (const void*)(B + j * ldb + c) : (const void*)B,
                                                                cnt * (int)sizeof(T));
                    }
                }
            }
        }
        tsm2a::commit();                          // one group per tile, empty past the end: wait counts stay uniform
    };

    T acc[RR][CC];
#pragma unroll
    for (int i = 0; i < RR; ++i)
#pragma unroll
        for (int c = 0; c < CC; ++c) acc[i][c] = T(0);

    const int arow_l = COL ? wr * TR * RR + tr * V : wr * TR * RR + tr;   // this lane's first local row
    // local row of accumulator row i: row-major arow_l + i * TR; column-major groups of V rows
    auto lrow = [&](int i) { return COL ? arow_l + (i / V) * TR * V + i % V : arow_l + i * TR; };
#pragma unroll
    for (int s = 0; s < S - 1; ++s) issue(s);

    for (int t = 0; t < ntiles; ++t) {
        tsm2a::wait_prior<S - 2>();               // this thread's copies of tile t have landed
        __syncthreads();                          // everyone's have; stage (t - 1) % S is free
        issue(t + S - 1);
        const T* const sa = smem + (t % S) * STAGE;
        const T* const sb = sa + A_STAGE;
        if constexpr (COL) {
#pragma unroll
            for (int jq = 0; jq < JW; ++jq) {
                const int j = wj * JW + jq;
                T b[CC];
#pragma unroll
                for (int cv = 0; cv < CC; cv += V) tsm2a::Lds16<T>::go(sb + j * KP + tc * CC + cv, b + cv);
#pragma unroll
                for (int g = 0; g < RR / V; ++g) {
                    T a[V];
                    tsm2a::Lds16<T>::go(sa + j * AS + arow_l + g * TR * V, a);
#pragma unroll
                    for (int v = 0; v < V; ++v)
#pragma unroll
                        for (int c = 0; c < CC; ++c) acc[g * V + v][c] += a[v] * b[c];
                }
            }
        } else {
#pragma unroll
            for (int st = 0; st < JW / V; ++st) {
                const int j = wj * JW + st * V;
                T a[RR][V];
                const T* const ar = sa + arow_l * AS + ((j / V) ^ (arow_l & SWM)) * V;   // swizzled chunk
#pragma unroll
                for (int i = 0; i < RR; ++i) tsm2a::Lds16<T>::go(ar + i * TR * AS, a[i]);
#pragma unroll
                for (int q = 0; q < V; ++q) {
                    T b[CC];
#pragma unroll
                    for (int cv = 0; cv < CC; cv += V) tsm2a::Lds16<T>::go(sb + (j + q) * KP + tc * CC + cv, b + cv);
#pragma unroll
                    for (int i = 0; i < RR; ++i)
#pragma unroll
                        for (int c = 0; c < CC; ++c) acc[i][c] += a[i][q] * b[c];
                }
            }
        }
    }
    tsm2a::wait_prior<0>();                       // only empty groups remain; drain anyway
    __syncthreads();                              // the stages may now be reused for the reduction

    if (WJ == 1) {
#pragma unroll
        for (int i = 0; i < RR; ++i) {
            const long long row = row0 + lrow(i);
            if (row < m) {
#pragma unroll
                for (int c = 0; c < CC; ++c) {
                    const int col = c0 + tc * CC + c;
                    if (col < k) C[row * ldc_r + (long long)col * ldc_c] = acc[i][c];
                }
            }
        }
    } else {
        T* const red = smem;                      // [WJ][R][KP]
#pragma unroll
        for (int i = 0; i < RR; ++i)
#pragma unroll
            for (int c = 0; c < CC; ++c)
                red[(wj * R + lrow(i)) * KP + tc * CC + c] = acc[i][c];
        __syncthreads();
        for (int e = tid; e < R * KP; e += NT) {
            const int rl = e / KP, cl = e % KP;
            const long long row = row0 + rl;
            const int col = c0 + cl;
            if (row < m && col < k) {
                T s = red[e];
#pragma unroll
                for (int w = 1; w < WJ; ++w) s += red[w * R * KP + e];
                C[row * ldc_r + (long long)col * ldc_c] = s;
            }
        }
    }
}

template <typename T, int WR, int WJ, int TR, int RR, int CC, int TJ, int S, int BV, int MB>
__global__ void __launch_bounds__(32 * WR * WJ, MB)
tsm2_rowmajor_async(const T* __restrict__ A, long long lda, const T* __restrict__ B, long long ldb,
                    T* __restrict__ C, long long ldc_r, long long ldc_c, int m, int n, int k, int passes) {
    tsm2_async_body<false, T, WR, WJ, TR, RR, CC, TJ, S, BV>(A, lda, B, ldb, C, ldc_r, ldc_c, m, n, k, passes);
}

template <typename T, int WR, int WJ, int TR, int RR, int CC, int TJ, int S, int BV, int MB>
__global__ void __launch_bounds__(32 * WR * WJ, MB)
tsm2_colmajor_async(const T* __restrict__ A, long long lda, const T* __restrict__ B, long long ldb,
                    T* __restrict__ C, long long ldc_r, long long ldc_c, int m, int n, int k, int passes) {
    tsm2_async_body<true, T, WR, WJ, TR, RR, CC, TJ, S, BV>(A, lda, B, ldb, C, ldc_r, ldc_c, m, n, k, passes);
}
