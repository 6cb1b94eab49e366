// Shared by the segsort's and the radix method's kernels (count_scan.cu, segsort.cu, radix.cu): the
// control words of their zeroed workspace and the radix digits.
#ifndef SPTRANS_SEGMENTED_CUH
#define SPTRANS_SEGMENTED_CUH

// control words (ctrl, zeroed by the host)
#define SEG_BAD 0
#define SEG_TILE_CTR 1
#define SEG_N_MED 2
#define SEG_N_LONG 3
#define SEG_N_HUGE 4
#define SEG_N_LIVE 5      // the valid entries (spt_digits), for the radix passes
// radix method: digits of at most 8 bits (RDX_BINS values), at most 4 passes (31-bit columns)
#define RDX_BINS 256
#define RDX_MAX_PASSES 4

#endif  // SPTRANS_SEGMENTED_CUH
