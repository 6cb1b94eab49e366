// Bitmaps of a row's columns written out in column order (hash_shared.cu, hash_global.cu,
// hash_esc.cu).
#ifndef MATPLAN_SPGEMM_BITMAPS_CUH
#define MATPLAN_SPGEMM_BITMAPS_CUH

// numeric_shared's bitmap branch and numeric_global_seg write their bitmaps' rows in two steps
// (BITMAP_STAGED 1: write_bits_staged) or each thread its run straight from the bitmap (0).
#ifndef BITMAP_STAGED
#define BITMAP_STAGED 1
#endif

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

#endif  // MATPLAN_SPGEMM_BITMAPS_CUH
