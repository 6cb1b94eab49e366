"""What the statistics kernel (matplan/kernels/statistics.cu) must return, by the NumPy formulas,
and Python mirrors of its device algorithms (pairwise sums by leaves and last arrivers, the sorted
warp length from a histogram and a list of long rows, products per row by warp tiles, the drawn
rows by segments and chunks, a drawn row's examined products), which the CPU tests compare with
the formulas and the GPU tests with the kernel."""
import numpy as np
import scipy.sparse as sp

from matplan.core import compression as C, features as F, validation
from matplan.core.figures import CsrFlags, KernelFigures
from matplan.kernels import statistics as S


def matrices():
    rng = np.random.default_rng(11)
    out = {"identity": sp.identity(50, format="csr"), "one row": sp.csr_matrix(np.ones((1, 40))),
           "empty": sp.csr_matrix((0, 7)), "no nonzeros": sp.csr_matrix((30, 20)),
           "empty rows": sp.random(3000, 200, density=0.01, format="csr", random_state=1),
           "one long row": sp.csr_matrix((np.ones(9000), np.arange(9000), [0, 9000] + [9000] * 99), shape=(100, 9000))}
    for nnz, m in ((65_537, 6_000), (150_000, 2_000)):
        out[f"random {nnz} in {m} rows"] = sp.csr_matrix(
            (np.ones(nnz), (rng.integers(0, m, nnz), rng.integers(0, m, nnz))), shape=(m, m))
    lengths = rng.zipf(1.7, 5_000).clip(0, 3_000)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    cols = rng.integers(0, 5_000, indptr[-1])   # unsorted, with duplicates
    out["skewed, unsorted, duplicates"] = sp.csr_matrix((np.ones(indptr[-1]), cols, indptr), shape=(5_000, 5_000))
    wide = sp.random(400, 300, density=0.05, format="csr", random_state=4)
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int64)
    out["int64 indices"] = wide
    return out


def partner(A):
    """A's partner in a SpGEMM test: A.T where A is not square."""
    return A.T.tocsr() if A.shape[0] != A.shape[1] else A


def flags_of(M) -> CsrFlags:
    """check_csr's findings by NumPy."""
    indptr, indices = np.asarray(M.indptr), np.asarray(M.indices)
    bad = validation._csr_flags(np, indptr, indices, M.shape[1], indices.shape[0])
    return CsrFlags(*(bool(b) for b in bad), int(indptr[0]), int(indptr[-1]))


def products(A, B) -> np.ndarray:
    b_len = np.diff(np.asarray(B.indptr, dtype=np.int64))
    csum = np.concatenate([[0], np.cumsum(b_len[np.asarray(A.indices)[:int(A.indptr[-1])]])])
    indptr = np.asarray(A.indptr, dtype=np.int64)
    return csum[indptr[1:]] - csum[indptr[:-1]]


def squared_deviations_sum(x, total) -> float:
    """numpy.add.reduce((x - mean)**2) as features._int_mean_var computes it (mean = total / m)."""
    mean = np.float64(total) / x.shape[0]
    dev = x.astype(np.int64) - mean
    return float(np.add.reduce(dev * dev))


def spread_values(A) -> np.ndarray:
    m, n = A.shape
    nnz = int(A.indptr[-1])
    pos = np.linspace(0, nnz - 1, min(nnz, F.SPREAD_SAMPLES)).astype(np.int64)
    rows = np.searchsorted(A.indptr, pos, side="right") - 1
    cols = np.asarray(A.indices)[pos].astype(np.float64)
    return np.abs(cols / n - (rows + 0.5) / m)


def drawn_rows(rowct) -> np.ndarray:
    csum = np.cumsum(rowct)
    total = int(csum[-1])
    targets = (np.arange(C.COMPRESSION_SAMPLES, dtype=np.float64) + 0.5) * (total / C.COMPRESSION_SAMPLES)
    return np.searchsorted(csum, targets, side="right")


def examine_row(A, B, row, p):
    """(distinct columns, products examined) of drawn row ``row`` with ``p`` products, as
    compression.sampled_compression takes them: every stride-th entry, the first 2 x cap products."""
    cap = C.COMPRESSION_ROW_CAP
    stride = (p + cap - 1) // cap
    start, end = int(A.indptr[row]), int(A.indptr[row + 1])
    cols = np.asarray(A.indices)[start:end:stride].astype(np.int64)
    b_start = np.asarray(B.indptr, dtype=np.int64)[cols]
    b_len = np.asarray(B.indptr, dtype=np.int64)[cols + 1] - b_start
    before = np.cumsum(b_len) - b_len
    take = np.clip(2 * cap - before, 0, b_len)
    keys = [np.asarray(B.indices)[s:s + t] for s, t in zip(b_start, take)]
    keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    return int(np.unique(keys).size), int(take.sum())


def reference_figures(op: str, A, B=None) -> KernelFigures:
    """The figures the kernel returns for ``op`` on host CSR ``A`` (and ``B``), by NumPy."""
    m, n = A.shape
    mode = S.MODES[op]
    indptr = np.asarray(A.indptr, dtype=np.int64)
    lengths = np.diff(indptr)
    kw = {}
    if mode & (S.ROWS | S.TRANS) and m:
        kw.update(row_min=int(lengths.min()), row_max=int(lengths.max()))
    nnz = int(indptr[-1])
    if mode & S.TRANS and nnz and n:
        kw.update(col_max=int(np.bincount(np.asarray(A.indices)[:nnz], minlength=n).max()))
    if mode & S.ROWS:
        pad = (-m) % F.WARP
        padded = np.concatenate([lengths, np.zeros(pad, np.int64)])
        groups = padded.reshape(-1, F.WARP)
        kw.update(empty_rows=int((lengths == 0).sum()) if m else 0,
                  warp_before=int(groups.max(axis=1).sum()) if m else 0,
                  warp_after=int(np.sort(padded)[::-1].reshape(-1, F.WARP).max(axis=1).sum()) if m else 0,
                  row_ss=squared_deviations_sum(lengths, int(indptr[-1] - indptr[0])) if m else 0.0,
                  spread_sum=float(np.add.reduce(spread_values(A))) if nnz and n else 0.0)
    if mode & S.GEMM:
        kw["b"] = flags_of(B)
        if m:
            rowct = products(A, B)
            total = int(rowct.sum())
            kw.update(products=total, rowct_min=int(rowct.min()), rowct_max=int(rowct.max()),
                      rowct_ss=squared_deviations_sum(rowct, total), rbs_groups=F.rbsparse_histogram(rowct))
            if total:
                drawn = drawn_rows(rowct)
                distinct, examined = [0] * len(drawn), [0] * len(drawn)
                for k, row in enumerate(drawn):
                    if k == 0 or drawn[k - 1] != row:
                        distinct[k], examined[k] = examine_row(A, B, int(row), int(rowct[row]))
                kw.update(drawn=tuple(int(r) for r in drawn), drawn_products=tuple(int(rowct[r]) for r in drawn),
                          distinct=tuple(distinct), examined=tuple(examined))
            else:
                kw.update(drawn=(0,) * S.DRAWS, drawn_products=(0,) * S.DRAWS, distinct=(0,) * S.DRAWS,
                          examined=(0,) * S.DRAWS)
        else:
            kw.update(rbs_groups=(0,) * 6, drawn=(0,) * S.DRAWS, drawn_products=(0,) * S.DRAWS,
                      distinct=(0,) * S.DRAWS, examined=(0,) * S.DRAWS)
    return KernelFigures(a=flags_of(A), **kw)


# --- mirrors of the device algorithms -------------------------------------------------------------
def mirror_pairwise(values, order_seed=None) -> float:
    """statistics.cu's pairwise_sum: windows of 64 positions, the leaf owner's NumPy-order sum,
    then the climb where the second child to finish adds a node (leaves finish in a shuffled
    order when ``order_seed`` is given)."""
    v = [float(x) for x in values]
    N = len(v)
    leaves = []
    for w in range((N + 63) // 64):
        q = min(64 * w + 63, N - 1)
        lo, length, path = 0, N, []
        while length > 128:
            n2 = length // 2
            n2 -= n2 % 8
            path.append((lo, lo + n2))
            if q < lo + n2:
                length = n2
            else:
                lo, length = lo + n2, length - n2
        if lo >= 64 * w:
            leaves.append((lo, length, path))
    if order_seed is not None:
        np.random.default_rng(order_seed).shuffle(leaves)
    slot, count, result = {}, {}, []
    for lo, length, path in leaves:
        val = C.leaf_sum(v[lo:lo + length])   # the leaf owner's NumPy-order sum
        slot[lo >> 6] = val
        for node_lo, split in reversed(path):
            count[split >> 6] = count.get(split >> 6, 0) + 1
            if count[split >> 6] == 1:
                break
            val = slot[node_lo >> 6] + slot[split >> 6]
            slot[node_lo >> 6] = val
        else:
            result.append(0.0 + val)
    assert len(result) == (1 if N else 0)
    return result[0] if result else 0.0


def mirror_warp_after(lengths, hist_size=S.HIST, seed=0) -> int:
    """The sorted warp length's sum from a histogram of lengths below ``hist_size`` and the longer
    rows listed in any order (each rank 32 g of the list adds its length - hist_size + 1)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    hist = np.bincount(lengths[lengths < hist_size], minlength=hist_size)
    longs = lengths[lengths >= hist_size]
    np.random.default_rng(seed).shuffle(longs)
    K = len(longs)
    C, acc = K, 0
    for t in range(hist_size - 1, 0, -1):
        C += int(hist[t])
        acc += (C + 31) // 32
    for i, L in enumerate(longs):
        rank = int((longs > L).sum() + (longs[:i] == L).sum())
        if rank % 32 == 0:
            acc += int(L) - hist_size + 1
    return acc


def mirror_products(A, B, tile=256, seed=0) -> np.ndarray:
    """Products per row by the kernel's warp tiles: lanes' rows by search, a segmented sum per
    step of 32, the last row's sum carried, one add a row a tile (tiles in a shuffled order)."""
    m = A.shape[0]
    indptr = np.asarray(A.indptr, dtype=np.int64)
    b_len = np.diff(np.asarray(B.indptr, dtype=np.int64))
    indices = np.asarray(A.indices, dtype=np.int64)
    rowct = np.zeros(m, dtype=np.int64)
    e_lo, e_hi = int(indptr[0]), int(indptr[-1])
    starts = list(range(e_lo, e_hi, tile))
    np.random.default_rng(seed).shuffle(starts)
    row = lambda e: int(np.searchsorted(indptr, e, side="right") - 1)  # noqa: E731
    for t0 in starts:
        t1 = min(t0 + tile, e_hi)
        r_hi = row(t1 - 1)
        carry_row, carry = -1, 0
        for s in range(t0, t1, 32):
            r = [row(e) if e < t1 else r_hi for e in range(s, s + 32)]
            v = [int(b_len[indices[e]]) if e < t1 else 0 for e in range(s, s + 32)]
            seg = list(v)
            for lane in range(1, 32):   # the inclusive sum within runs of one row
                if r[lane] == r[lane - 1]:
                    seg[lane] += seg[lane - 1]
            if carry_row != r[0]:
                if carry_row >= 0:
                    rowct[carry_row] += carry
                carry = 0
            if r[0] == r[31]:
                carry += seg[31]
            else:
                for lane in range(31):
                    if r[lane + 1] != r[lane]:
                        rowct[r[lane]] += seg[lane] + (carry if r[lane] == r[0] else 0)
                carry = seg[31]
            carry_row = r[31]
        if carry_row >= 0:
            rowct[carry_row] += carry
    return rowct


def mirror_drawn(rowct, grid: int, block: int = 256) -> np.ndarray:
    """The drawn rows by the kernel's segments (one a block) and chunks (one a thread), comparing
    running sums as float64."""
    m = len(rowct)
    total = int(rowct.sum())
    per_draw = total / C.COMPRESSION_SAMPLES
    out = np.full(C.COMPRESSION_SAMPLES, -1, dtype=np.int64)
    per = -(-m // grid)
    seg = [int(rowct[min(m, b * per):min(m, b * per + per)].sum()) for b in range(grid)]
    for b in range(grid):
        lo, hi = min(m, b * per), min(m, b * per + per)
        if lo >= hi:
            continue
        at = sum(seg[:b])
        cper = -(-(hi - lo) // block)
        for t in range(block):
            c_lo, c_hi = min(hi, lo + t * cper), min(hi, lo + t * cper + cper)
            chunk = int(rowct[c_lo:c_hi].sum())
            for k in range(C.COMPRESSION_SAMPLES):
                target = (k + 0.5) * per_draw
                if c_lo < c_hi and float(at) <= target < float(at + chunk):
                    c = at
                    for i in range(c_lo, c_hi):
                        c += int(rowct[i])
                        if float(c) > target:
                            assert out[k] == -1
                            out[k] = i
                            break
            at += chunk
    return out


def mirror_examine(A, B, row, p, block=256):
    """(distinct, examined) of one drawn row as the kernel's block takes it: chunks of ``block``
    entries, each entry's products from the prefix of the capped counts, found by a search."""
    cap = 2 * C.COMPRESSION_ROW_CAP
    stride = (p + C.COMPRESSION_ROW_CAP - 1) // C.COMPRESSION_ROW_CAP
    start, length = int(A.indptr[row]), int(A.indptr[row + 1] - A.indptr[row])
    entries = (length + stride - 1) // stride
    b_ptr = np.asarray(B.indptr, dtype=np.int64)
    seen, examined, keys = 0, 0, set()
    c0 = 0
    while c0 < entries and seen < cap:
        ts = range(c0, min(c0 + block, entries))
        cols = [int(A.indices[start + t * stride]) for t in ts] + [0] * (block - len(ts))
        bs = [int(b_ptr[c]) if i < len(ts) else 0 for i, c in enumerate(cols)]
        bl = [int(b_ptr[c + 1] - b_ptr[c]) if i < len(ts) else 0 for i, c in enumerate(cols)]
        ex = np.concatenate([[0], np.cumsum(bl)[:-1]])
        left = max(0, cap - seen)
        offs = [min(int(e), left) for e in ex]
        taken = min(int(sum(bl)), left)
        for v in range(taken):
            j = max(i for i in range(block) if offs[i] <= v)
            keys.add(int(B.indices[bs[j] + v - offs[j]]))
        examined += taken
        seen += int(sum(bl))
        c0 += block
    return len(keys), examined
