// The analysis of the hash SpGEMM (kernels/spgemm/analysis.py, symbolic.py): the product offsets
// and C's row offsets by one-launch scans, every row's table (classify_rows) and the rows grouped
// by table (bucket_rows); words_differ checks a guessed analysis (guesses.py).
#include "hash_common.cuh"
#include "block_scan.cuh"

#define MAX_GROUPS 32   // table sizes + 2 (empty rows, global path) that classify/bucket handle

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
// Mirrors rules.table_index / symbolic_index (the NumPy/CuPy reference, kernels/spgemm/rules.py).
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

// *flag = 1 when words a[0..n) and b[0..n) differ anywhere (one block): spgemm's guessed launch
// path checks the analysis it did not read back against the one it guessed from.
extern "C" __global__ void words_differ(const unsigned long long* __restrict__ a,
                                        const unsigned long long* __restrict__ b, const int n,
                                        unsigned long long* __restrict__ flag) {
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (a[i] != b[i]) *flag = 1ull;
}
