// TSM2: tall-and-skinny GEMM, C (m x k) = A (m x n) . B (n x k), k small (SEEDS section 5).
//
// Two kernels, one per layout of A, both reading A exactly ceil(k / T2) times and never copying it:
//
//  tsm2_colmajor<T, T1, T2, T3>  -- the paper's form, A column-major (A[i, j] at A[i + j*lda]).
//     One thread per row of A, T1 threads per block. The outer product is walked over j: each
//     element A[i, j] is loaded once and multiplied by the T2 columns of B's row j, which a tile
//     of T1 rows of B staged in shared memory provides (a broadcast read: every thread of a warp
//     reads the same address). Each thread loads T3 elements of its row at once and prefetches the
//     next T3 (and its row of the next B tile) while computing the current ones.
//
//  tsm2_rowmajor<T, T1, T2, T3, V, G>  -- A row-major (A[i, j] at A[i*lda + j]), the CuPy default.
//     A thread per row would read with stride lda, so a warp walks T3 rows at once instead: its
//     lanes form G groups; lane l of a group loads V consecutive elements (16 bytes when V > 1)
//     of each row, the group covers 32/G*V columns per step, every load coalesced. A tile of B is
//     staged transposed (and swizzled) in shared memory; each lane computes T2/G columns of C for
//     the T3 rows, reusing each B element it reads T3 times. A shuffle reduction within each
//     group finishes the sums. T1 threads per block share the B tile.
//
// Split over j (split-K, for too few rows to fill the GPU): block (x, y) handles columns
// [y * split, (y + 1) * split) of A and writes its partial C at C + y * ldc_s (a contiguous
// S x m x k workspace, ldc_r = k, ldc_c = 1); the last of row tile x's S blocks to finish
// (tickets[x]) sums the S slices of the tile's rows in slice order (deterministic) into Cf with
// strides (fr, fc) and sets tickets[x] back to 0 for the next launch (split_finish): one launch,
// no second one to sum. split = n, ldc_s = 0 and Cf, tickets null for no split.
// Both: B is C-contiguous (n x k, ldb >= k); C is written with strides (ldc_r, ldc_c); rows past m
// are clamped for loads and skipped for stores; columns past n load as zero (A and B alike, so no
// 0 * Inf appears); columns of C past k in the last pass are computed on zero B and not stored.
// Compiles with NVRTC (CuPy RawModule) and with plain nvcc.

template <typename T> struct Zero { static __device__ __forceinline__ T get() { return T(0); } };

// The split's finish (header): the rows of tile blockIdx.x (tile_rows a tile, clamped to m) of the
// S slices at ws (mk = m * k elements apart) summed into Cf by the last of the tile's blocks. Every
// thread of the block calls it.
// Not inlined, its sum loop not unrolled, its indexes 32-bit: inlined, it moved the kernels'
// register counts (row kernel, float, 256 threads, k = 4: 64 -> 84) and an H200 ran the unsplit
// row kernel 9% slower (16384 x 16384 float32, k = 1).
template <typename T>
__device__ __noinline__ void split_finish(const T* ws, long long mk, int k, int tile_rows, long long m,
                                          T* __restrict__ Cf, long long fr, long long fc, unsigned* tickets) {
    const unsigned S = gridDim.y;
    __threadfence();                                   // this block's partials before its ticket
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) last = atomicAdd(tickets + blockIdx.x, 1u) == S - 1;
    if (!__syncthreads_or(last)) return;               // no shared flag: kernels at 48 KB have no room
    __threadfence();
    const long long r_lo = (long long)blockIdx.x * tile_rows;
    const int rows = (int)(r_lo + tile_rows < m ? tile_rows : m - r_lo);  // 32-bit indexes suffice
    for (int q = threadIdx.x; q < rows * k; q += blockDim.x) {
        const int r = q / k, c = q - r * k;
        const T* w = ws + (r_lo + r) * k + c;
        T s = __ldcg(w);                               // L2: the other blocks' writes
#pragma unroll 1
        for (unsigned t = 1; t < S; ++t) s += __ldcg(w + t * mk);
        Cf[(r_lo + r) * fr + c * fc] = s;
    }
    if (threadIdx.x == 0) tickets[blockIdx.x] = 0u;
}

// Streaming loads of V consecutive elements (evict-first: A is read once, B and C stay in L2).
template <typename T, int V> struct Ld;
template <> struct Ld<float, 1> {
    static __device__ __forceinline__ void go(const float* p, float* o) { o[0] = __ldcs(p); }
};
template <> struct Ld<float, 2> {
    static __device__ __forceinline__ void go(const float* p, float* o) {
        float2 x = __ldcs(reinterpret_cast<const float2*>(p)); o[0] = x.x; o[1] = x.y;
    }
};
template <> struct Ld<float, 4> {
    static __device__ __forceinline__ void go(const float* p, float* o) {
        float4 x = __ldcs(reinterpret_cast<const float4*>(p));
        o[0] = x.x; o[1] = x.y; o[2] = x.z; o[3] = x.w;
    }
};
template <> struct Ld<double, 1> {
    static __device__ __forceinline__ void go(const double* p, double* o) { o[0] = __ldcs(p); }
};
template <> struct Ld<double, 2> {
    static __device__ __forceinline__ void go(const double* p, double* o) {
        double2 x = __ldcs(reinterpret_cast<const double2*>(p)); o[0] = x.x; o[1] = x.y;
    }
};

// Shared-memory reads of V consecutive elements (16-byte aligned by construction).
template <typename T, int V> struct Lds {
    static __device__ __forceinline__ void go(const T* p, T* o) {
#pragma unroll
        for (int q = 0; q < V; ++q) o[q] = p[q];
    }
};
template <> struct Lds<float, 4> {
    static __device__ __forceinline__ void go(const float* p, float* o) {
        float4 x = *reinterpret_cast<const float4*>(p); o[0] = x.x; o[1] = x.y; o[2] = x.z; o[3] = x.w;
    }
};
template <> struct Lds<double, 2> {
    static __device__ __forceinline__ void go(const double* p, double* o) {
        double2 x = *reinterpret_cast<const double2*>(p); o[0] = x.x; o[1] = x.y;
    }
};

// ---------------------------------------------------------------------------------------------
// Column-major A: the paper's Alg. 4 (outer product, B tile in shared memory, prefetch), each
// thread owning V consecutive rows so one 16-byte load brings V elements of a column (V = 1 is
// the paper's thread per row). The B tile is double-buffered: one barrier per tile.
// ---------------------------------------------------------------------------------------------
template <typename T, int T1, int T2, int T3, int V>
__global__ void __launch_bounds__(T1)
tsm2_colmajor(const T* __restrict__ A, long long lda, const T* __restrict__ B, long long ldb,
              T* __restrict__ C, long long ldc_r, long long ldc_c, int m, int n, int k,
              int split, long long ldc_s, T* __restrict__ Cf, long long fr, long long fc, unsigned* tickets)
{
    static_assert(T1 % 32 == 0 && T1 % T3 == 0, "T1 must be a multiple of 32 and of T3");
    constexpr int VB = 16 / sizeof(T);                 // elements per 16-byte shared read
    constexpr int T2P = (T2 + VB - 1) / VB * VB;       // padded row of the B tile
    __shared__ __align__(16) T Bs[2][T1 * T2P];
    {                                                  // split over j: this block's slice of n
        const long long jb = (long long)blockIdx.y * split;
        A += jb * lda; B += jb * ldb; C += blockIdx.y * ldc_s;
        n = (int)((long long)n - jb < split ? (long long)n - jb : split);
    }

    const int tid = threadIdx.x;
    const long long i0 = ((long long)blockIdx.x * T1 + tid) * V;
    const bool full = i0 + V <= m;                     // all V rows inside A: vector loads
    long long rows[V];
#pragma unroll
    for (int v = 0; v < V; ++v) rows[v] = i0 + v < m ? i0 + v : (long long)m - 1;   // clamp

    for (int c0 = 0; c0 < k; c0 += T2) {
        T acc[V][T2];
#pragma unroll
        for (int v = 0; v < V; ++v)
#pragma unroll
            for (int c = 0; c < T2; ++c) acc[v][c] = Zero<T>::get();

        T bnext[T2P];
        auto load_b = [&](long long j) {               // row j of B (zeros past n or k)
#pragma unroll
            for (int c = 0; c < T2P; ++c)
                bnext[c] = (j < n && c < T2 && c0 + c < k) ? B[j * ldb + c0 + c] : Zero<T>::get();
        };
        // A[rows, j] for j = jn .. jn + T3 - 1 (zeros past n)
        T anext[T3][V];
        auto load_a = [&](long long jn) {
#pragma unroll
            for (int q = 0; q < T3; ++q) {
                const long long j = jn + q;
                if (j < n && full) {
                    Ld<T, V>::go(A + i0 + j * lda, anext[q]);
                } else {
#pragma unroll
                    for (int v = 0; v < V; ++v)
                        anext[q][v] = j < n ? __ldcs(A + rows[v] + j * lda) : Zero<T>::get();
                }
            }
        };
        load_b(tid);
#pragma unroll
        for (int c = 0; c < T2P; ++c) Bs[0][tid * T2P + c] = bnext[c];
        load_b((long long)T1 + tid);
        load_a(0);
        __syncthreads();

        int buf = 0;
        for (int j0 = 0; j0 < n; j0 += T1, buf ^= 1) {
            const T* bs = Bs[buf];
#pragma unroll 1
            for (int jj = 0; jj < T1; jj += T3) {
                T acur[T3][V];
#pragma unroll
                for (int q = 0; q < T3; ++q)
#pragma unroll
                    for (int v = 0; v < V; ++v) acur[q][v] = anext[q][v];
                load_a((long long)j0 + jj + T3);       // prefetch the next T3 columns
#pragma unroll
                for (int q = 0; q < T3; ++q) {
                    const T* brow = bs + (jj + q) * T2P;
#pragma unroll
                    for (int c = 0; c < T2P; c += VB) {
                        T b[VB];
                        Lds<T, VB>::go(brow + c, b);
#pragma unroll
                        for (int u = 0; u < VB; ++u)
                            if (c + u < T2) {
#pragma unroll
                                for (int v = 0; v < V; ++v) acc[v][c + u] += acur[q][v] * b[u];
                            }
                    }
                }
            }
            // The other buffer was last read before the previous barrier: fill it, then prefetch.
#pragma unroll
            for (int c = 0; c < T2P; ++c) Bs[buf ^ 1][tid * T2P + c] = bnext[c];
            load_b((long long)j0 + 2 * T1 + tid);
            __syncthreads();
        }
#pragma unroll
        for (int v = 0; v < V; ++v)
            if (i0 + v < m) {
#pragma unroll
                for (int c = 0; c < T2; ++c)
                    if (c0 + c < k) C[(i0 + v) * ldc_r + (long long)(c0 + c) * ldc_c] = acc[v][c];
            }
        __syncthreads();                               // the next pass refills buffer 0
    }
    if (gridDim.y > 1) split_finish(C - blockIdx.y * ldc_s, ldc_s, k, T1 * V, m, Cf, fr, fc, tickets);
}

// ---------------------------------------------------------------------------------------------
// Row-major A: a warp per T3 rows, its lanes split in G groups of 32/G. A lane of group g computes
// columns [g*CG, (g+1)*CG) of C for the T3 rows, CG = ceil(T2/G), from V consecutive elements
// (16 bytes) of each row, and each B element it reads from shared memory serves T3*V products:
// shared-memory bytes per byte of A are T2/T3, accumulators per lane T3*CG (G trades registers
// for rows per warp, SEEDS section 5's register budget).
// A loads in flight: D steps of the warp (T3*32/G*16 bytes each). With D = 1 every group loads
// all T3 rows (the G groups of a warp load the same bytes). With D > 1 the groups share the loads:
// lane g of a group loads rows i*SH + g % SH (SH = G, or 2, or 1: the largest dividing both T3
// and G) and gets the other SH - 1 rows of each set by shuffles from the other groups' lanes, so
// D = SH steps in flight take the registers one step took without sharing. (On an H100, 1 KB per
// warp step with 16 warps per SM reached 0.74 of the copy bandwidth at k = 16, G = 2, where 2 KB
// per step reached 0.95 at k = 8, G = 1.)
// The transposed B tile (CG*G rows of U*TJ columns: U steps of the warp) is XOR-swizzled by 16-byte
// chunks (chunk ^ (row % 8)) so the transposing stores have at most 2-way bank conflicts and the
// vector reads none; double-buffered, prefetched through registers, one barrier per U steps (warps
// drift up to U steps apart, which keeps more A loads in flight). A shuffle reduction within each
// group finishes the sums.
// ---------------------------------------------------------------------------------------------
template <typename T, int T1, int T2, int T3, int V, int G, int U, int D>
__global__ void __launch_bounds__(T1)
tsm2_rowmajor(const T* __restrict__ A, long long lda, const T* __restrict__ B, long long ldb,
              T* __restrict__ C, long long ldc_r, long long ldc_c, int m, int n, int k,
              int split, long long ldc_s, T* __restrict__ Cf, long long fr, long long fc, unsigned* tickets)
{
    static_assert(T1 % 32 == 0 && 32 % G == 0 && G <= 4, "T1: multiple of 32; G: 1, 2 or 4");
    static_assert(D >= 1 && U % D == 0, "D: a divisor of U (constant register slots)");
    constexpr int SH = D == 1 ? 1 : T3 % G == 0 ? G : T3 % 2 == 0 && G % 2 == 0 ? 2 : 1;   // see above
    constexpr int RL = T3 / SH;                         // rows a lane loads per step
    constexpr int W = T1 / 32;                          // warps per block
    constexpr int JL = 32 / G;                          // lanes along a row
    constexpr int TJ = JL * V;                          // columns of A per step (rows of the B tile)
    constexpr int CG = (T2 + G - 1) / G;                // columns of C per lane
    constexpr int BT = U * TJ;                          // columns of the B tile
    constexpr int NB = (BT * T2 + T1 - 1) / T1;         // B tile elements each thread moves
    __shared__ __align__(16) T Bs[2][G * CG * BT];
    {                                                  // split over j: this block's slice of n
        const long long jb = (long long)blockIdx.y * split;
        A += jb; B += jb * ldb; C += blockIdx.y * ldc_s;
        n = (int)((long long)n - jb < split ? (long long)n - jb : split);
    }

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int jl = lane % JL, grp = lane / JL;
    const long long r0 = ((long long)blockIdx.x * W + (tid >> 5)) * T3;
    // Row of (row set i, relative group t) for this lane: i*SH + (grp + t) % SH; t = 0: its own loads.
    const T* arow[RL];
#pragma unroll
    for (int i = 0; i < RL; ++i) {
        const long long r = r0 + i * SH + grp % SH;
        arow[i] = A + (r < m ? r : (long long)m - 1) * lda;   // clamp: loads stay inside A
    }
    int src[SH];                                        // lane holding relative group t's rows
#pragma unroll
    for (int t = 0; t < SH; ++t) src[t] = jl + JL * ((grp + t) % G);
    // element (row c, column j) of a B tile buffer: chunks of V columns swizzled by c % 8 (JL >= 8)
    auto bidx = [](int c, int j) { return c * BT + ((j / V) ^ (c & 7)) * V + j % V; };

    for (int c0 = 0; c0 < k; c0 += T2) {
        T acc[RL][SH][CG];
#pragma unroll
        for (int i = 0; i < RL; ++i)
#pragma unroll
            for (int t = 0; t < SH; ++t)
#pragma unroll
                for (int c = 0; c < CG; ++c) acc[i][t][c] = Zero<T>::get();

        // B[j0 + jj, c0 + c] for this thread's slots e = tid + s * T1 (c = e % T2, jj = e / T2)
        T bnext[NB];
        auto load_b = [&](long long j0) {
#pragma unroll
            for (int s = 0; s < NB; ++s) {
                const int e = tid + s * T1, c = e % T2, jj = e / T2;
                const long long j = j0 + jj;
                bnext[s] = (e < BT * T2 && j < n && c0 + c < k) ? B[j * ldb + c0 + c] : Zero<T>::get();
            }
        };
        auto store_b = [&](T* bs) {
#pragma unroll
            for (int s = 0; s < NB; ++s) {
                const int e = tid + s * T1;
                if (e < BT * T2) bs[bidx(e % T2, e / T2)] = bnext[s];
            }
        };
        T anext[D][RL][V];                              // step s of the pass in slot s % D
        auto load_a = [&](T (&o)[RL][V], long long j) { // V elements of this lane's rows from column j
#pragma unroll
            for (int i = 0; i < RL; ++i) {
                if (j + V <= n) {
                    Ld<T, V>::go(arow[i] + j, o[i]);
                } else {
#pragma unroll
                    for (int q = 0; q < V; ++q)
                        o[i][q] = (j + q < n) ? __ldcs(arow[i] + j + q) : Zero<T>::get();
                }
            }
        };
        load_b(0);
        store_b(Bs[0]);
        load_b(BT);
#pragma unroll
        for (int d = 0; d < D; ++d) load_a(anext[d], (long long)d * TJ + jl * V);
        __syncthreads();

        int buf = 0;
        for (int j0 = 0; j0 < n; j0 += BT, buf ^= 1) {
            const T* bs = Bs[buf];
#pragma unroll 1
            for (int u0 = 0; u0 < U; u0 += D) {
#pragma unroll
                for (int d = 0; d < D; ++d) {
                    T acur[RL][SH][V];
#pragma unroll
                    for (int i = 0; i < RL; ++i)
#pragma unroll
                        for (int q = 0; q < V; ++q) {
                            acur[i][0][q] = anext[d][i][q];
#pragma unroll
                            for (int t = 1; t < SH; ++t)
                                acur[i][t][q] = __shfl_sync(0xffffffffu, anext[d][i][q], src[t]);
                        }
                    const int jt = (u0 + d) * TJ + jl * V;          // this lane's columns in the tile
                    load_a(anext[d], (long long)j0 + D * TJ + jt);  // prefetch D steps ahead
#pragma unroll
                    for (int cc = 0; cc < CG; ++cc) {
                        const int c = grp * CG + cc;   // rows past T2 hold stale values, never stored
                        T b[V];
                        Lds<T, V>::go(bs + bidx(c, jt), b);
#pragma unroll
                        for (int i = 0; i < RL; ++i)
#pragma unroll
                            for (int t = 0; t < SH; ++t)
#pragma unroll
                                for (int q = 0; q < V; ++q) acc[i][t][cc] += acur[i][t][q] * b[q];
                    }
                }
            }
            // The other buffer was last read before the previous barrier: fill it, then prefetch.
            store_b(Bs[buf ^ 1]);
            load_b((long long)j0 + 2 * BT);
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < RL; ++i)
#pragma unroll
            for (int t = 0; t < SH; ++t)
#pragma unroll
                for (int cc = 0; cc < CG; ++cc) {
                    T s = acc[i][t][cc];
#pragma unroll
                    for (int off = JL / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
                    const long long row = r0 + i * SH + (grp + t) % SH;
                    const int c = grp * CG + cc;
                    if ((((i * SH + t) * CG + cc) % JL) == jl && row < m && c < T2 && c0 + c < k)
                        C[row * ldc_r + (long long)(c0 + c) * ldc_c] = s;
                }
        __syncthreads();                                // the next pass refills buffer 0
    }
    if (gridDim.y > 1) split_finish(C - blockIdx.y * ldc_s, ldc_s, k, W * T3, m, Cf, fr, fc, tickets);
}

// Split-K partial products: C[i, j] = sum over s in slice order of ws[s][i][j] (ws: S x m x k,
// contiguous), C strided by (ldc_r, ldc_c). Deterministic; one launch instead of a CuPy
// reduction, whose host cost was most of a small TSM2 call's.
template <typename T>
__global__ void tsm2_split_sum(const T* __restrict__ ws, const int S, const long long mk, const int k,
                               T* __restrict__ C, const long long ldc_r, const long long ldc_c) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < mk;
         e += (long long)gridDim.x * blockDim.x) {
        T s = ws[e];
        for (int t = 1; t < S; ++t) s += ws[t * mk + e];
        C[(e / k) * ldc_r + (e % k) * ldc_c] = s;
    }
}
