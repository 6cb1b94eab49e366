// Segment-sort SpTRANS (sptrans.transpose(method="segsort")): six plain launches, no grid barrier;
// the first two (spt_count: column counts and ranks, spt_scan: A^T's indptr and the columns binned
// by length) are in count_scan.cu, the other four here.
// tests/sptrans_reference.py ports each kernel (segsort_* functions).
//   spt_scatter    : as merge.cu's phase 2 (merge path over A's rows; key (row << 32 | e) to its slot)
//   spt_sort_short : a thread per column of L <= short_max (all columns are scanned, no list): the
//                    warp stages its 32 columns' slots in shared memory (coalesced), each lane
//                    insertion-sorts its column there, the warp writes the outputs (coalesced)
//   spt_sort_big   : a warp per medium column (bitonic in shared memory, skipped when the keys are
//                    already in order), then a block per long
//                    column (bitonic in shared memory, up to `cap` keys), then the fallback's first
//                    step: the huge columns' chunks of cap keys, work items over all blocks, each
//                    sorted in shared memory back into keys
//   spt_merge_long : the fallback's second step: a block per huge column, merge-path rounds between
//                    two global buffers, the last round writing the outputs
// Keys are unique (e is), so any correct sort gives the one stable order: no stability needed.

#include "common.cuh"
#include "segmented.cuh"

#define SEG_SHORT_BLOCK 128
#define SEG_SHORT_STAGE 1024     // keys a warp stages (32 columns of <= 32 keys)
#ifndef SEG_SHORT_BATCH
#define SEG_SHORT_BATCH 4        // slots a lane loads at once in spt_sort_short's staging and output
#endif
#define SEG_BIG_BLOCK 256
#define SEG_WARP_KEYS 512        // most keys of a warp-sorted column (warp_max <= this)
#define SEG_BLOCK_KEYS 4096      // most keys a block sorts in shared memory (cap <= this)
#define SEG_SENTINEL_KEY 0xffffffffffffffffull
#define SEG_MERGE_BLOCK 512

// merge.cu's phase_scatter: ITEMS path steps a thread, one thread a launch slot: the walk first (which steps
// are entries, their rows), then the entries' loads (indices, rank, then t_indptr) each unrolled so
// the ITEMS random reads are in flight together instead of one dependent chain per entry.
extern "C" __global__ void __launch_bounds__(SPT_BLOCK)
spt_scatter(const int* __restrict__ a_indptr, const int* __restrict__ indices, int m, long long nnz,
            const int* __restrict__ t_indptr, const int* __restrict__ rank, int n, u64* keys, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    const long long total = (long long)m + nnz;
    const long long d = ((long long)blockIdx.x * SPT_BLOCK + threadIdx.x) * SPT_ITEMS;
    if (d >= total) return;
    long long x = path_search(a_indptr + 1, m, nnz, d);
    long long y = d - x;
    const long long y0 = y;
    int row[SPT_ITEMS];
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {   // entries of this thread: y0, y0 + 1, ... (rows row[])
        row[k] = -1;
        if (x + y < total) {
            if (y < nnz && x < m && (long long)a_indptr[x + 1] > y) { row[k] = (int)x; ++y; }
            else ++x;
        }
    }
    const int cnt = (int)(y - y0);
    int col[SPT_ITEMS], r[SPT_ITEMS];
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) col[k] = k < cnt ? indices[y0 + k] : -1;
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) r[k] = (k < cnt && col[k] >= 0 && col[k] < n) ? rank[y0 + k] : 0;
    int rows[SPT_ITEMS];                    // row of the k-th entry (compacted from the walk)
    {
        int j = 0;
#pragma unroll
        for (int k = 0; k < SPT_ITEMS; ++k) rows[k] = 0;
#pragma unroll
        for (int k = 0; k < SPT_ITEMS; ++k) {
            if (row[k] >= 0) {
#pragma unroll
                for (int q = 0; q < SPT_ITEMS; ++q) if (q == j) rows[q] = row[k];   // register-indexed
                ++j;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < SPT_ITEMS; ++k) {
        if (k < cnt && col[k] >= 0 && col[k] < n)
            keys[(long long)t_indptr[col[k]] + r[k]] = ((u64)rows[k] << 32) | (u64)(y0 + k);
    }
}

__device__ __forceinline__ void insertion_sort(u64* s, int len) {
    for (int i = 1; i < len; ++i) {
        const u64 v = s[i];
        int k = i - 1;
        while (k >= 0 && s[k] > v) { s[k + 1] = s[k]; --k; }
        s[k + 1] = v;
    }
}

// Bitonic sort of s[0..P) (P a power of two) by nt threads (thread t), ascending; WARP: the
// threads are one warp (__syncwarp between stages), else the block (__syncthreads).
template <bool WARP>
__device__ __forceinline__ void bitonic(u64* s, int P, int t, int nt) {
    for (int k = 2; k <= P; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int q = t; q < P / 2; q += nt) {
                const int i = (q / j) * 2 * j + (q & (j - 1));
                const int l = i + j;
                const u64 a = s[i], b = s[l];
                if ((a > b) == ((i & k) == 0)) { s[i] = b; s[l] = a; }
            }
            if (WARP) __syncwarp(); else __syncthreads();
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(SEG_SHORT_BLOCK)
spt_sort_short(const int* __restrict__ t_indptr, int n, u64* keys, const T* __restrict__ data,
               int* __restrict__ out_idx, T* __restrict__ out_val, int short_max, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ u64 s_buf[SEG_SHORT_BLOCK / 32][SEG_SHORT_STAGE];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const long long j0 = (long long)blockIdx.x * SEG_SHORT_BLOCK + w * 32;
    if (j0 >= n) return;                                      // warp-uniform
    const long long jend = j0 + 32 < n ? j0 + 32 : n;
    const long long j = j0 + lane;
    const int lo = t_indptr[j0], hi = t_indptr[jend];
    int s = 0, L = 0;
    if (j < n) { s = t_indptr[j]; L = t_indptr[j + 1] - s; }
    const bool mine = j < n && L <= short_max;
    u64* buf = s_buf[w];
    if (hi - lo <= SEG_SHORT_STAGE) {
        // staging and the output in rounds of SEG_SHORT_BATCH slots a lane, their loads issued
        // together: a loop of one slot a step waited for each load before issuing the next
        for (int p0 = lo + lane; p0 < hi; p0 += 32 * SEG_SHORT_BATCH) {
            u64 k[SEG_SHORT_BATCH];
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u) {
                const int p = p0 + 32 * u;
                k[u] = p < hi ? keys[p] : SEG_SENTINEL_KEY;
            }
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u)
                if (p0 + 32 * u < hi) buf[p0 + 32 * u - lo] = k[u];
        }
        __syncwarp();
        unsigned others = __ballot_sync(0xffffffffu, j < n && !mine);   // medium/long: not ours
        while (others) {
            const int src = __ffs(others) - 1;
            others &= others - 1;
            const int os = __shfl_sync(0xffffffffu, s, src), ol = __shfl_sync(0xffffffffu, L, src);
            for (int k = lane; k < ol; k += 32) buf[os - lo + k] = SEG_SENTINEL_KEY;
        }
        __syncwarp();
        if (mine && L > 1) insertion_sort(buf + (s - lo), L);
        __syncwarp();
        for (int p0 = lo + lane; p0 < hi; p0 += 32 * SEG_SHORT_BATCH) {
            u64 k[SEG_SHORT_BATCH];
            T v[SEG_SHORT_BATCH];
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u) {
                const int p = p0 + 32 * u;
                k[u] = p < hi ? buf[p - lo] : SEG_SENTINEL_KEY;
            }
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u)
                if (k[u] != SEG_SENTINEL_KEY) v[u] = data[k[u] & 0xffffffffull];   // the gathers in flight together
#pragma unroll
            for (int u = 0; u < SEG_SHORT_BATCH; ++u) {
                if (k[u] == SEG_SENTINEL_KEY) continue;
                const long long p = p0 + 32 * u;
                out_idx[p] = (int)(k[u] >> 32);
                out_val[p] = v[u];
            }
        }
    } else if (mine) {                                           // a crowded warp: in place
        insertion_sort(keys + s, L);
        for (int k = 0; k < L; ++k) write_final<T>((long long)s + k, keys[s + k], data, out_idx, out_val);
    }
}

// Merge-path rounds over one huge row of A^T (L > cap keys at slots [s, s + L), sorted in chunks of
// cap keys by spt_sort_big) by one block: runs of w = cap, 2 cap, ... merged pairwise between keys
// and scratch, the last round writing the outputs.
template <typename T>
__device__ void merge_rounds(long long s, int L, int cap, u64* keys, u64* scratch,
                             const T* __restrict__ data, int* __restrict__ out_idx, T* __restrict__ out_val) {
    u64* src = keys + s;
    u64* dst = scratch + s;
    for (long long w = cap; w < L; w *= 2) {
        const bool final = 2 * w >= L;
        for (long long p = (long long)threadIdx.x * SPT_ITEMS; p < L; p += (long long)blockDim.x * SPT_ITEMS) {
            const long long a0 = (p / (2 * w)) * (2 * w);
            const long long am = a0 + w < L ? a0 + w : L, ae = a0 + 2 * w < L ? a0 + 2 * w : L;
            const long long diag = p - a0, alen = am - a0, blen = ae - am;
            long long lo = diag - blen > 0 ? diag - blen : 0, hi = diag < alen ? diag : alen;
            while (lo < hi) {
                const long long mid = (lo + hi) >> 1;
                if (src[a0 + mid] <= src[am + diag - 1 - mid]) lo = mid + 1;
                else hi = mid;
            }
            long long ia = a0 + lo, ib = am + diag - lo;
            const long long pend = p + SPT_ITEMS < ae ? p + SPT_ITEMS : ae;
            for (long long out = p; out < pend; ++out) {
                u64 key;
                if (ib >= ae || (ia < am && src[ia] <= src[ib])) key = src[ia++];
                else key = src[ib++];
                if (final) write_final<T>(s + out, key, data, out_idx, out_val);
                else dst[out] = key;
            }
        }
        __syncthreads();
        u64* tmp = src; src = dst; dst = tmp;
    }
}

template <typename T>
__global__ void __launch_bounds__(SEG_MERGE_BLOCK)
spt_merge_long(const int* __restrict__ t_indptr, const int* __restrict__ huge_list, const int* ctrl, u64* keys,
               u64* scratch, const T* __restrict__ data, int* __restrict__ out_idx, T* __restrict__ out_val,
               int cap, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    const int n_huge = ctrl[SEG_N_HUGE];
    for (int i = blockIdx.x; i < n_huge; i += gridDim.x) {   // block-uniform
        const int c = huge_list[i];
        const long long s = t_indptr[c];
        merge_rounds<T>(s, t_indptr[c + 1] - (int)s, cap, keys, scratch, data, out_idx, out_val);
    }
}

template <typename T>
__global__ void __launch_bounds__(SEG_BIG_BLOCK)
spt_sort_big(const int* __restrict__ t_indptr, int n, const int* __restrict__ seg_list,
             const int* __restrict__ huge_list, const int* ctrl, u64* keys, const T* __restrict__ data,
             int* __restrict__ out_idx, T* __restrict__ out_val, int cap, const unsigned* __restrict__ only_if) {
    if (only_if && !*only_if) return;   // a pattern replay's full path: only where A's pattern changed
    __shared__ u64 s_buf[SEG_BLOCK_KEYS];
    const int n_med = ctrl[SEG_N_MED], n_long = ctrl[SEG_N_LONG], n_huge = ctrl[SEG_N_HUGE];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int warps = SEG_BIG_BLOCK / 32;
    u64* wb = s_buf + w * SEG_WARP_KEYS;
    for (long long i = (long long)blockIdx.x * warps + w; i < n_med; i += (long long)gridDim.x * warps) {
        const int c = seg_list[i];
        const long long s = t_indptr[c];
        const int L = t_indptr[c + 1] - (int)s;
        int P = 32;
        while (P < L) P <<= 1;
        bool ordered = true;
        for (int k = lane; k < P; k += 32) {
            wb[k] = k < L ? keys[s + k] : SEG_SENTINEL_KEY;
            if (k > 0 && k < L && keys[s + k - 1] > keys[s + k]) ordered = false;
        }
        __syncwarp();
        if (!__all_sync(0xffffffffu, ordered)) bitonic<true>(wb, P, lane, 32);   // often in order already
        for (int k = lane; k < L; k += 32) write_final<T>(s + k, wb[k], data, out_idx, out_val);
        __syncwarp();
    }
    __syncthreads();
    for (long long i = blockIdx.x; i < n_long; i += gridDim.x) {   // block-uniform
        const int c = seg_list[n - 1 - i];
        const long long s = t_indptr[c];
        const int L = t_indptr[c + 1] - (int)s;
        int P = 32;
        while (P < L) P <<= 1;
        bool ordered = true;
        for (int k = threadIdx.x; k < P; k += SEG_BIG_BLOCK) {
            s_buf[k] = k < L ? keys[s + k] : SEG_SENTINEL_KEY;
            if (k > 0 && k < L && keys[s + k - 1] > keys[s + k]) ordered = false;
        }
        if (!__syncthreads_and(ordered)) bitonic<false>(s_buf, P, threadIdx.x, SEG_BIG_BLOCK);
        for (int k = threadIdx.x; k < L; k += SEG_BIG_BLOCK) write_final<T>(s + k, s_buf[k], data, out_idx, out_val);
        __syncthreads();
    }
    // huge rows (L > cap): their chunks of cap keys are work items spread over all blocks (item q
    // to block q mod gridDim.x), each sorted in shared memory back into keys; spt_merge_long merges
    long long item = 0;
    for (int i = 0; i < n_huge; ++i) {
        const int c = huge_list[i];
        const long long s = t_indptr[c];
        const int L = t_indptr[c + 1] - (int)s;
        const long long chunks = (L + cap - 1) / cap;
        const long long first = item + ((long long)blockIdx.x - item % gridDim.x + gridDim.x) % gridDim.x;
        for (long long q = first; q < item + chunks; q += gridDim.x) {   // block-uniform
            const long long c0 = (q - item) * cap;
            const int len = L - c0 < cap ? (int)(L - c0) : cap;
            for (int k = threadIdx.x; k < cap; k += SEG_BIG_BLOCK) s_buf[k] = k < len ? keys[s + c0 + k] : SEG_SENTINEL_KEY;
            __syncthreads();
            bitonic<false>(s_buf, cap, threadIdx.x, SEG_BIG_BLOCK);
            for (int k = threadIdx.x; k < len; k += SEG_BIG_BLOCK) keys[s + c0 + k] = s_buf[k];
            __syncthreads();
        }
        item += chunks;
    }
}

template __global__ void spt_sort_short<float>(const int*, int, u64*, const float*, int*, float*, int, const unsigned*);
template __global__ void spt_sort_short<double>(const int*, int, u64*, const double*, int*, double*, int, const unsigned*);
template __global__ void spt_sort_big<float>(const int*, int, const int*, const int*, const int*, u64*,
                                             const float*, int*, float*, int, const unsigned*);
template __global__ void spt_sort_big<double>(const int*, int, const int*, const int*, const int*, u64*,
                                              const double*, int*, double*, int, const unsigned*);
template __global__ void spt_merge_long<float>(const int*, const int*, const int*, u64*, u64*, const float*,
                                               int*, float*, int, const unsigned*);
template __global__ void spt_merge_long<double>(const int*, const int*, const int*, u64*, u64*, const double*,
                                                int*, double*, int, const unsigned*);
