"""SpMV / SpMM kernels on the GPU: CSR scalar, vector, split, merge path and SpMM; ELL-R; BRC; BRCP.

The CUDA sources are in ``spmv.cu`` (one template over value and index type,
compiled once per (dtype, index type) with every kernel in it). Formats are
built by :mod:`matplan.kernels.spmv_formats` with CuPy array operations; the
launch arguments are fixed in ``prepare`` so that ``run`` only allocates the
output (``cupy.empty``) and launches, with no host synchronisation.

Costs are analytic: bytes each kernel streams (padding and warp divergence from
the warp-length figures) over the device bandwidth times a per-kernel
efficiency, a straggler term for the longest row's serial work, and ~6 us per
launch; ``prepare_s`` estimates the conversion from the bytes it moves.
"""
from __future__ import annotations

import functools

import numpy as np

from ...core.xp import cupy_module
from ...models import spmv as spmv_model, traffic
from .. import _cuda
from . import formats as fmt
from ...core.types import Cost
from ..base import Kernel, Prepared
from ..registry import register

CU = "spmv/spmv.cu"
THREADS = 256
#: Fraction of the copy bandwidth each kernel sustains on the bytes it streams (first H100
#: run: CSR scalar 0.72, CSR vector 0.69, ELL-R 0.68, BRCP 0.68 of copy bandwidth on 3-D Poisson).
EFFICIENCY = {"spmv.csr_scalar": 0.65, "spmv.csr_vector": 0.8, "spmv.ellr": 0.8,
              "spmv.brc": 0.75, "spmv.brcp": 0.75, "spmv.csr_merge": 0.8,
              "spmv.csr_spmm": 0.7, "spmv.csr_split": 0.8}
#: One kernel launch from Python, seconds (fitted when the kernels launched through CuPy's
#: RawKernel; they launch through _cuda.launcher since 2026-11-24, ~5 us).
LAUNCH_S = 6e-6
#: One loop iteration of a lone warp: the longest row or block runs alone at the end. An H100
#: took 0.35-0.5 us per iteration (CSR vector on R-MAT, BRCP with the paper's widths on skewed),
#: with or without 4x unrolling (second run).
ITER_S = 4e-7
#: Cost of each launched thread (indptr loads, shuffles): W = 4 vs 8 vs 16 lanes on 3-D Poisson.
#: CSR scalar and vector launch their threads (1 or W per row) once for each of the k columns
#: (grid (rows, k)), so they count m * k and m * W * k threads; on the H100 tuning data
#: (2026-11-23) CSR vector's time past the bytes grew as m * W * k at 3-5e-12 s a thread
#: (Poisson, banded, uniform, k = 4 and 16).
THREAD_S = 5e-12
#: Entries each lane of CSR scalar / vector loads per loop trip (spmv.cu's UNROLL): the longest
#: row takes row_max / (UNROLL * lanes) trips of ITER_S. Counting one trip per entry predicted
#: 3-5x the H100's times where that row dominates (2026-11-23 tuning data: skewed, R-MAT, ice40,
#: gene_go; CSR scalar 0.17-0.3x, CSR vector 0.15-0.45x); per trip they fit 0.75-1.2x.
UNROLL = 4
#: Merge path (csr_merge), fitted on the H100 tuning data of the chunked kernel (2026-11-24, 36
#: timings: skewed, R-MAT, ice40; k = 1, 4, 16; float32 and float64) with A's bytes at
#: EFFICIENCY: a fixed cost (two launches and the carry buffer), the dense bytes (X rows gathered
#: at random, Y written) at MERGE_DENSE_EFFICIENCY of the copy bandwidth, and each tile's search,
#: scan and barriers once per column. Measured / model 0.73-1.46 (the costs before, which charged
#: the dense bytes like A's, predicted 0.43-1.05x the time).
MERGE_FIXED_S = 21e-6
MERGE_DENSE_EFFICIENCY = 0.37
MERGE_TILE_S = 3.3e-9
#: CSR SpMM: entries each slot takes per loop trip (spmv.cu's csr_spmm). With it and ITER_S the
#: cost is 0.8-1.2x the H100's times on the long-row matrices in float64 (2026-11-23, k=16,
#: a10ff08: skewed 24 ms, R-MAT 2.3 ms, ice40 0.42 ms) but up to 1.8x in float32 and on
#: gene_go (rows of ~1000); efficiency 0.7 gave 0.8-1.25x on the balanced matrices.
SPMM_PER_TRIP = 2
#: Merge-path SpMM: a block computes kc columns of Y from one load of its tile (spmv.cu's
#: csr_merge), kc as large as leaves this many blocks per SM (merge_columns).
MERGE_BLOCKS_PER_SM = 16
#: Columns a merge-path block computes together (csr_merge's MERGE_V) when it computes at least
#: this many: an X row's values of the chunk are fetched in one sector. Blocks of fewer columns
#: (SpMV) use the one-column instantiation, which needs fewer registers and shared memory.
#: Compiled as csr_merge<..., 1> and <..., MERGE_V> (spmv.cu instantiates 1 and 4).
MERGE_V = 4
#: The merge path is offered only when the longest row exceeds this many mean rows: on the
#: balanced benchmark matrices (longest <= 15x mean) it was 1.2-1.6x the best row kernel.
MERGE_MIN_SKEW = 64
#: ELL-R is not offered when padding to the longest row needs more slots than this.
ELLR_MAX_PAD_FACTOR, ELLR_MAX_PAD_EXTRA = 4, 1 << 20
#: Format conversion: sustained fraction of bandwidth for sort/scatter passes, and per-op cost
#: (warm, 7-8M nonzeros: ELL-R 1-2 ms, BRCP/BRC 5-13 ms).
CONVERT_EFFICIENCY, CONVERT_OP_S = 0.15, 50e-6
#: BRCP/BRC padding, estimated from the sorted warp length, is capped at this fraction of nnz
#: (long rows are cut into pieces, so the sorted-slice padding of the head rows does not occur).
BRCP_PAD_CAP = 0.5
#: BRC / BRCP as SpMM (k > 1): each of the k column passes gathers B's column at A's column
#: indices, which misses L2 as for cuSPARSE (traffic.column_major_gathers_missed), plus a fixed
#: cost a call: effective bytes per missed gather at the copy bandwidth and seconds, least squares
#: (relative error) on the 256 BRC/BRCP SpMM timings of tuning-h100-2026-11-24-training-launch.jsonl.
#: Measured / model within 0.7-1.4: 44% -> 57% (median 0.75 -> 0.89; uniform-large 0.30 -> 0.64,
#: R-MAT large 0.60 -> 1.10); large stencils (dragon, world_highways, Poisson large) stay at 0.3-0.6.
BLOCKED_SPMM_GATHER_BYTES = 29.0
BLOCKED_SPMM_OVERHEAD_S = 5e-6


# ------------------------------------------------------------------ compilation
def _names(ctype, itype):
    return ([f"csr_scalar<{ctype},{itype}>"]
            + [f"csr_vector<{ctype},{itype},{w}>" for w in fmt.VECTOR_WIDTHS]
            + [f"{k}<{ctype},{itype}>" for k in ("ellr", "brc", "brcp", "brcp_fixup")]
            + [f"csr_merge<{ctype},{itype},{ipt},{v}>" for ipt in fmt.MERGE_IPT for v in (1, MERGE_V)] + [f"merge_fixup<{ctype}>"]
            + [f"csr_split<{ctype},{itype},{w}>" for w in fmt.VECTOR_WIDTHS]
            + [f"csr_spmm<{ctype},{itype},{kk},{s}>" for kk in fmt.SPMM_COLUMNS for s in fmt.SPMM_SLOTS
               if kk * s <= 32])


def _packed(fns, name: str, index_dtype):
    """The packed driver launch (_cuda.Launcher) of kernel ``name`` (a name expression of
    :func:`functions`' dict ``fns``), its signature read from the declaration in spmv.cu with the
    index type I of ``index_dtype``."""
    return _cuda.packed(fns[name], CU, name, I=_cuda.index_letter(index_dtype))


def functions(dtype, index_dtype) -> dict:
    """Every kernel of spmv.cu for (dtype, index_dtype), by name expression (compiled once, and
    looked up once per device: ~30 handle lookups per prepare cost 30-100 us of it)."""
    return _functions(_cuda.ctype(dtype), _cuda.ctype(index_dtype), _cupy().cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _functions(ct, it, device_id) -> dict:
    names = _names(ct, it)
    mod = _cuda.module(CU, names)
    return {n: mod.get_function(n) for n in names}


def _cupy():
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("GPU SpMV kernels need CuPy and an NVIDIA GPU")
    return cp


def _csr_arrays(A):
    """(indptr, indices, data) of CSR ``A`` on the GPU (moved there if on the host)."""
    cp = _cupy()
    for name in ("indptr", "indices", "data"):
        if not hasattr(A, name):
            raise TypeError(f"A: expected a CSR matrix (indptr, indices, data), got {type(A).__name__}")
    data = cp.asarray(A.data)
    if np.dtype(data.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"A: dtype {data.dtype} is not supported; expected float32 or float64")
    indptr, indices = cp.asarray(A.indptr), cp.asarray(A.indices)
    if np.dtype(indptr.dtype) != np.dtype(indices.dtype):
        it = np.promote_types(indptr.dtype, indices.dtype)
        indptr, indices = indptr.astype(it), indices.astype(it)
    if np.dtype(indices.dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"A: index dtype {indices.dtype} is not supported; expected int32 or int64")
    return indptr, indices, data


def _choice(params: dict, name: str, default: int, allowed) -> int:
    """params[name] (``default`` when absent) as an int, or ValueError naming the allowed values."""
    value = int(params.get(name, default))
    if value not in allowed:
        raise ValueError(f"params[{name!r}]: expected one of {tuple(allowed)}, got {value}")
    return value


def _grid(nthreads: int) -> int:
    return max(1, -(-int(nthreads) // THREADS))


# ------------------------------------------------------------------ shared behaviour
class _SpMV(Kernel):
    ops = ("spmv", "spmm")
    backend = "gpu"
    deterministic = True

    # -- running -----------------------------------------------------------
    def run(self, prepared, B, out=None):
        cp = _cupy()
        m, n = prepared.shape
        if B.ndim not in (1, 2) or B.shape[0] != n:
            raise ValueError(f"B: expected shape ({n},) or ({n}, k), got {B.shape}")
        if B.dtype != prepared.dtype:
            raise TypeError(f"B: dtype {B.dtype} does not match A's {prepared.dtype}")
        k = 1 if B.ndim == 1 else B.shape[1]
        oshape = (m,) if B.ndim == 1 else (m, k)
        if out is None:
            out = cp.empty(oshape, dtype=prepared.dtype)
        elif out.shape != oshape or out.dtype != prepared.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out: expected a C-contiguous {prepared.dtype} array of shape {oshape}, "
                             f"got {out.dtype} {out.shape}")
        if m == 0 or k == 0:
            return out
        if k > 65535:
            raise ValueError(f"B: at most 65535 columns are supported, got {k}")
        if not B.flags.c_contiguous:
            B = cp.ascontiguousarray(B)
        self._launch(prepared, B, out, k)
        return out

    # -- costing helpers -----------------------------------------------------
    @staticmethod
    def _sizes(f):
        return traffic.itemsize(f), traffic.index_size(f)

    def _time(self, nbytes, device, launches=1, straggler_iters=0.0, threads=0.0):
        eff = EFFICIENCY[self.name]
        return (nbytes / (device.mem_bandwidth * eff) + launches * LAUNCH_S
                + straggler_iters * ITER_S + threads * THREAD_S)

    @staticmethod
    def _convert_s(nbytes, ops, device):
        return nbytes / (device.mem_bandwidth * CONVERT_EFFICIENCY) + ops * CONVERT_OP_S

    def _prepared(self, params, arrays, shape, dtype, **meta):
        return Prepared(self.name, dict(params), arrays, tuple(shape), np.dtype(dtype), meta)


# ------------------------------------------------------------------ CSR
class _CSR(_SpMV):
    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        fns = functions(data.dtype, indices.dtype)
        m = A.shape[0]
        # a packed driver launch (_cuda.Launcher): ~4 us of host time fewer than CuPy's on a call
        # that is 15-25 us in all on the small real matrices
        return self._prepared(params, dict(indptr=indptr, indices=indices, data=data), A.shape, data.dtype,
                              launch=_packed(fns, self._fn_name(data.dtype, indices.dtype, params), indices.dtype),
                              grid_x=_grid(self._threads(m, params)), m=m)

    def _launch(self, p, B, out, k):
        a, meta = p.arrays, p.meta
        meta["launch"]((meta["grid_x"], k), (THREADS,), (meta["m"], k, a["indptr"], a["indices"], a["data"], B, out))


def _width_candidates(f):
    """Lanes per row to try: the width for the mean row length and its neighbours."""
    w = fmt.vector_width(f.row_mean)
    return [{"W": cand} for cand in sorted({max(2, w // 2), w, min(32, w * 2)})]


class CsrScalar(_CSR):
    """Thread per row: good for very short rows; loads of A do not coalesce."""
    name = "spmv.csr_scalar"
    reads_a_at_run = True

    def _fn_name(self, dt, it, params):
        return f"csr_scalar<{_cuda.ctype(dt)},{_cuda.ctype(it)}>"

    def _threads(self, m, params):
        return m

    def cost(self, f, params, device):
        v, i = self._sizes(f)
        slots = f.warp_len_before * f.m   # a warp runs as long as its longest row
        nbytes = slots * (v + i) * f.k + (f.m + 1) * i + traffic.dense_bytes(f)
        trips = np.ceil(f.row_max / UNROLL)
        return Cost(0.0, self._time(nbytes, device, 1, trips, f.m * f.k),
                    f"thread per row: warps run {f.warp_len_before:.2f} iterations on average "
                    f"({slots / max(f.nnz, 1):.2f}x the nonzeros as lane-slots), uncoalesced, "
                    f"~{EFFICIENCY[self.name]:.2f} of bandwidth")


class CsrVector(_CSR):
    """W lanes per row (W = 2..32 from the mean row length): coalesced loads, shuffle reduction."""
    name = "spmv.csr_vector"
    reads_a_at_run = True

    def candidates(self, f, device):
        return _width_candidates(f)

    def _fn_name(self, dt, it, params):
        w = _choice(params, "W", 32, fmt.VECTOR_WIDTHS)
        return f"csr_vector<{_cuda.ctype(dt)},{_cuda.ctype(it)},{w}>"

    def _threads(self, m, params):
        return m * int(params.get("W", 32))

    def cost(self, f, params, device):
        v, i = self._sizes(f)
        w = int(params["W"])
        lane_slots = f.m * w * max(1.0, np.ceil(f.row_mean / w))
        nbytes = f.nnz * (v + i) * f.k + 2 * f.m * i + traffic.dense_bytes(f)
        trips = np.ceil(f.row_max / (UNROLL * w))
        return Cost(0.0, self._time(nbytes, device, 1, trips, f.m * w * f.k),
                    f"{w} lanes per row (mean row {f.row_mean:.1f}) for each of {f.k} column(s): lanes busy "
                    f"{f.nnz / max(lane_slots, 1):.2f}, longest row {f.row_max} takes "
                    f"{int(trips)} trips of {UNROLL * w} entries")


class CsrSpmm(_CSR):
    """SpMM (k >= 2): KK column lanes x S nonzero slots per row; each lane group reads whole rows
    of X (coalesced) and A once per KK columns, where the kernels above read A once per column."""
    name = "spmv.csr_spmm"
    ops = ("spmm",)
    reads_a_at_run = True

    def candidates(self, f, device):
        slots = fmt.vector_width(f.row_mean) // 2      # about one pass over a mean row
        for s in sorted({fmt.spmm_slots(max(1, c), f.k) for c in (slots // 2, slots, slots * 2)}):
            yield {"S": s}

    def cost(self, f, params, device):
        v, i = self._sizes(f)
        kk, s = fmt.spmm_columns(f.k), fmt.spmm_slots(params["S"], f.k)
        chunks = -(-f.k // kk)
        trips = int(np.ceil(f.row_max / (SPMM_PER_TRIP * s))) * chunks   # the longest row's lone group
        nbytes = f.nnz * (v + i) * chunks + (f.m + 1) * i + traffic.dense_bytes(f)
        return Cost(0.0, self._time(nbytes, device, 1, trips, f.m * kk * s),
                    f"{kk} column lanes x {s} slots per row: A read {chunks}x for k={f.k} (once per "
                    f"column in the row kernels), X rows read {min(kk, f.k) * v} B at a time; longest row "
                    f"{f.row_max} takes {trips} trips")

    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        s = _choice(params, "S", 1, fmt.SPMM_SLOTS)
        fns = functions(data.dtype, indices.dtype)
        ct, it = _cuda.ctype(data.dtype), _cuda.ctype(indices.dtype)
        by_columns = {kk: _packed(fns, f"csr_spmm<{ct},{it},{kk},{fmt.spmm_slots(s, kk)}>", indices.dtype)
                      for kk in fmt.SPMM_COLUMNS}
        return self._prepared(dict(params, S=s), dict(indptr=indptr, indices=indices, data=data), A.shape,
                              data.dtype, launches=by_columns, m=A.shape[0])

    def _launch(self, p, B, out, k):
        a, meta = p.arrays, p.meta
        kk = fmt.spmm_columns(k)
        group = kk * fmt.spmm_slots(p.params["S"], k)
        meta["launches"][kk]((_grid(meta["m"] * group),), (THREADS,),
                             (meta["m"], k, a["indptr"], a["indices"], a["data"], B, out))


# ------------------------------------------------------------------ ELL-R
class Ellr(_SpMV):
    """ELL column-major + row lengths, thread per row; rows sorted by length when the rule says so."""
    name = "spmv.ellr"

    def supports(self, f):
        slots = fmt.ellr_padded_slots(f.m, f.row_max)
        limit = ELLR_MAX_PAD_FACTOR * f.nnz + ELLR_MAX_PAD_EXTRA
        if slots > limit:
            return (f"padding every row to the longest ({f.row_max} vs mean {f.row_mean:.1f}) needs "
                    f"{slots:,} slots for {f.nnz:,} nonzeros (> {ELLR_MAX_PAD_FACTOR} x nnz + "
                    f"{ELLR_MAX_PAD_EXTRA:,})")
        return None

    def candidates(self, f, device):
        yield {"sorted": spmv_model.ellr_should_sort(f.warp_len_before, f.warp_len_after)}

    @staticmethod
    def rule_text(f, sort):
        ratio = f.warp_len_after / f.warp_len_before if f.warp_len_before else 1.0
        op = "<=" if ratio <= spmv_model.ELLR_SORT_RATIO else ">"
        return (f"ELL-R {'sorted' if sort else 'unsorted'}: warp length {f.warp_len_before:.2f} -> "
                f"{f.warp_len_after:.2f} ({ratio:.2f} {op} {spmv_model.ELLR_SORT_RATIO})")

    def cost(self, f, params, device):
        v, i = self._sizes(f)
        sort = bool(params["sorted"])
        wl = f.warp_len_after if sort else f.warp_len_before
        nbytes = wl * f.m * (v + i) * f.k + f.m * (4 + (i if sort else 0)) + traffic.dense_bytes(f)
        total = fmt.ellr_padded_slots(f.m, f.row_max)
        conv = self._convert_s(total * (v + i) + f.nnz * (2 * (v + i) + 32), 25 if sort else 15, device)
        return Cost(conv, self._time(nbytes, device, 1, f.row_max, f.m),
                    f"{self.rule_text(f, sort)}; {wl * f.m / max(f.nnz, 1):.2f}x the nonzeros as "
                    f"lane-slots; {total:,} padded slots stored")

    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        sort = bool(params.get("sorted", False))
        e = fmt.ellr(indptr, indices, data, sort, xp=_cupy())
        arrays = dict(vals=e["vals"], cols=e["cols"], rl=e["rl"])
        if sort:
            arrays["perm"] = e["perm"]
        it = np.dtype(e["cols"].dtype)
        launch = _packed(functions(data.dtype, it), f"ellr<{_cuda.ctype(data.dtype)},{_cuda.ctype(it)}>", it)
        return self._prepared(params, arrays, A.shape, data.dtype, launch=launch, m=A.shape[0],
                              grid_x=_grid(A.shape[0]), stride=int(e["stride"]),
                              row_max=e["row_max"], has_perm=int(sort))

    def _launch(self, p, B, out, k):
        a, meta = p.arrays, p.meta
        perm = a.get("perm", a["cols"])   # not read when has_perm == 0
        meta["launch"]((meta["grid_x"], k), (THREADS,),
                       (meta["m"], k, meta["stride"], a["rl"], a["cols"], a["vals"], perm, meta["has_perm"], B, out))


# ------------------------------------------------------------------ BRC / BRCP
class _Blocked(_SpMV):
    def candidates(self, f, device):
        """The paper's rule, and (when it differs) the spread variant: T capped, long rows spread."""
        yield {"T": f.T, "long_factor": fmt.LONG_FACTORS[0]}
        if f.T > fmt.WIDTH_CAP or f.row_max > fmt.LONG_FACTORS[0] * f.T:
            yield {"T": min(f.T, fmt.WIDTH_CAP), "long_factor": fmt.LONG_FACTORS[1]}

    def _layout_estimate(self, f, params):
        """(padded slots, block rows, longest piece) predicted from the statistics."""
        T, lf = max(int(params["T"]), 1), int(params["long_factor"])
        sorted_pad = max(f.warp_len_after * f.m - f.nnz, 0.0)
        slots = f.nnz + min(sorted_pad, BRCP_PAD_CAP * f.nnz)
        longest = np.ceil(f.row_max / lf) if f.row_max > lf * T else min(f.row_max, T)
        rows = max(slots / max(min(T, max(f.row_mean, 1.0)), 1.0), f.m)
        return slots, rows, longest

    def _cost(self, f, params, device, per_row_bytes, launches, extra_why=""):
        v, i = self._sizes(f)
        slots, rows, longest = self._layout_estimate(f, params)
        nbytes = slots * (v + i) * f.k + rows * per_row_bytes + traffic.dense_bytes(f)
        conv = self._convert_s(slots * (v + i) + f.nnz * (2 * (v + i) + 64), 60, device)
        width = (f"T=round(mu+sigma)={f.T}" if params["T"] == f.T
                 else f"width capped at {params['T']} (T=round(mu+sigma)={f.T})")
        run = self._time(nbytes, device, launches, longest, rows)
        if f.k > 1:
            run += (traffic.column_major_gathers_missed(f, device.l2_bytes) * BLOCKED_SPMM_GATHER_BYTES
                    / device.mem_bandwidth + BLOCKED_SPMM_OVERHEAD_S)
        return Cost(conv, run,
                    f"{width}, rows > {params['long_factor']}*T cut to width "
                    f"ceil(nnz/{params['long_factor']}); ~{slots / max(f.nnz, 1):.2f}x the nonzeros "
                    f"as slots, longest piece {int(longest)}{extra_why}")

    def _build(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        cp = _cupy()
        T = params.get("T")
        if T is None:
            lf = cp.diff(indptr).astype(cp.float64)
            T = spmv_model.brcp_T(float(lf.mean()), float(lf.std())) if lf.size else 1
        lf = int(params.get("long_factor", fmt.LONG_FACTORS[0]))
        params = dict(params, T=int(T), long_factor=lf)
        b = fmt.brcp(indptr, indices, data, int(T), lf, xp=cp)
        it = np.dtype(b["cols"].dtype)
        return params, b, functions(data.dtype, it), _cuda.ctype(data.dtype), _cuda.ctype(it), it


class Brc(_Blocked):
    """BRC, the BRCP paper's non-deterministic baseline: every block row atomically adds into y.

    Here on the BRCP layout (same blocks), so BRC vs BRCP isolates the reduction.
    """
    name = "spmv.brc"
    deterministic = False

    def cost(self, f, params, device):
        v, i = self._sizes(f)
        c = self._cost(f, params, device, i + v * f.k, 2, "; atomics into a zeroed y")
        return Cost(c.prepare_s, c.run_s + f.m * f.k * v / device.mem_bandwidth, c.why)

    def prepare(self, A, params):
        params, b, fns, ct, itn, it = self._build(A, params)
        arrays = {k: b[k] for k in ("vals", "cols", "block_ptr", "row_perm")}
        return self._prepared(params, arrays, A.shape, b["vals"].dtype,
                              launch=_packed(fns, f"brc<{ct},{itn}>", it), nblocks=int(b["nblocks"]))

    def _launch(self, p, B, out, k):
        a = p.arrays
        out.fill(0)
        if p.meta["nblocks"]:
            p.meta["launch"]((_grid(p.meta["nblocks"] * 32), k), (THREADS,),
                             (p.meta["nblocks"], k, a["block_ptr"], a["row_perm"], a["cols"], a["vals"], B, out))


class Brcp(_Blocked):
    """BRCP: sorted rows, H = 32, the block-width rule, row-major filling, warp segmented sums.

    Bitwise reproducible for any number of blocks per row: segments of rows spanning
    several blocks go to a partials buffer reduced in block order (see spmv.cu).
    """
    name = "spmv.brcp"
    deterministic = True

    def cost(self, f, params, device):
        i = traffic.index_size(f)
        spans = f.row_max > int(params["T"])          # some row needs several pieces: fixup launch
        return self._cost(f, params, device, 4 + i, 1 + spans,
                          "; warp segmented sums" + (", fixed-order reduction of rows spanning blocks"
                                                     if spans else ""))

    def prepare(self, A, params):
        params, b, fns, ct, itn, it = self._build(A, params)
        arrays = {k: b[k] for k in ("vals", "cols", "block_ptr", "row_seg_len", "dest", "fix_rows",
                                    "fix_ptr")}
        nfix = int(b["fix_rows"].shape[0])
        return self._prepared(params, arrays, A.shape, b["vals"].dtype,
                              launch=_packed(fns, f"brcp<{ct},{itn}>", it),
                              fix=_packed(fns, f"brcp_fixup<{ct},{itn}>", it),
                              nblocks=int(b["nblocks"]), nfix=nfix, partials=int(b["partials"]))

    def _launch(self, p, B, out, k):
        cp = _cupy()
        a, meta = p.arrays, p.meta
        npart = meta["partials"]
        partials = cp.empty(npart * k, dtype=out.dtype) if npart else out
        if meta["nblocks"]:
            meta["launch"]((_grid(meta["nblocks"] * 32), k), (THREADS,),
                           (meta["nblocks"], k, a["block_ptr"], a["row_seg_len"], a["dest"], a["cols"], a["vals"],
                            B, out, partials))
        if meta["nfix"]:
            meta["fix"]((_grid(meta["nfix"] * 32), k), (THREADS,),
                        (meta["nfix"], k, a["fix_rows"], a["fix_ptr"], partials, out))


# ------------------------------------------------------------------ CSR merge path
def merge_columns(ntiles: int, k: int, sms: int) -> int:
    """Columns one merge-path block computes: the most that keep ntiles * ceil(k / kc) blocks
    >= MERGE_BLOCKS_PER_SM per SM (one load of the tile, its search and its X rows in L1 serve
    kc columns; fewer, larger blocks would leave SMs idle on small matrices)."""
    return max(1, min(k, ntiles * k // max(1, sms * MERGE_BLOCKS_PER_SM)))


class CsrMerge(_SpMV):
    """Merge-path CSR (Merrill & Garland 2016): equal shares of rows + nonzeros per thread.

    Load-balanced whatever the row lengths (no straggler row); prepare only splits the
    merge path into tiles (a searchsorted over indptr), the values and indices are A's own.
    Deterministic: carries of rows crossing threads and tiles are added in a fixed order.
    """
    name = "spmv.csr_merge"
    deterministic = True

    def supports(self, f):
        return _balanced(f, "the merge path's per-tile work costs 1.2-1.6x on such matrices")

    def candidates(self, f, device):
        for ipt in fmt.MERGE_IPT:
            yield {"ipt": ipt}

    def cost(self, f, params, device):
        v, i = self._sizes(f)
        tiles = (f.m + f.nnz) / (fmt.MERGE_NT * int(params["ipt"]))
        passes = -(-f.k // merge_columns(int(np.ceil(tiles)), f.k, device.sms))   # loads of A
        nbytes = (f.nnz * (v + i) * passes + (f.m + 1) * i
                  + 2 * tiles * (v * f.k + 24))                 # carries and their fix-up records
        run_s = (MERGE_FIXED_S + self._time(nbytes, device, 0) + tiles * f.k * MERGE_TILE_S
                 + traffic.dense_bytes(f) / (device.mem_bandwidth * MERGE_DENSE_EFFICIENCY))
        return Cost(self._convert_s(f.m * 16 + tiles * 40, 8, device), run_s,
                    f"merge path: {f.m + f.nnz:,} row ends + nonzeros in {int(np.ceil(tiles)):,} tiles of "
                    f"{fmt.MERGE_NT}x{params['ipt']} items, no straggler (longest row {f.row_max}), "
                    + (f"A read {passes}x for {f.k} columns, " if f.k > 1 else "")
                    + f"~{EFFICIENCY[self.name]:.2f} of bandwidth on A, {MERGE_DENSE_EFFICIENCY:.2f} on X and Y")

    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        ipt = _choice(params, "ipt", fmt.MERGE_IPT[0], fmt.MERGE_IPT)
        mp = fmt.merge_path(indptr, ipt, xp=_cupy())
        fns = functions(data.dtype, indices.dtype)
        ct, it = _cuda.ctype(data.dtype), _cuda.ctype(indices.dtype)
        arrays = dict(indptr=indptr, indices=indices, data=data, tile_row=mp["tile_row"],
                      fix_rows=mp["fix_rows"], fix_lo=mp["fix_lo"], fix_hi=mp["fix_hi"])
        return self._prepared(dict(params, ipt=ipt), arrays, A.shape, data.dtype,
                              launch=_packed(fns, f"csr_merge<{ct},{it},{ipt},1>", indices.dtype),
                              launch_v=_packed(fns, f"csr_merge<{ct},{it},{ipt},{MERGE_V}>", indices.dtype),
                              fix=_packed(fns, f"merge_fixup<{ct}>", indices.dtype),
                              m=A.shape[0], nnz=int(mp["nnz"]), ntiles=int(mp["ntiles"]),
                              nfix=int(mp["fix_rows"].shape[0]))

    def _launch(self, p, B, out, k):
        cp = _cupy()
        a, meta = p.arrays, p.meta
        carry = cp.empty(meta["ntiles"] * k, dtype=out.dtype)
        kc = merge_columns(meta["ntiles"], k, _cuda.device_attribute("MultiProcessorCount", cp.cuda.Device().id))
        launch = meta["launch_v"] if kc >= MERGE_V else meta["launch"]
        launch((meta["ntiles"], -(-k // kc)), (fmt.MERGE_NT,),
               (meta["m"], meta["nnz"], k, kc, a["tile_row"], a["indptr"], a["indices"], a["data"], B, out, carry))
        if meta["nfix"]:
            meta["fix"]((_grid(meta["nfix"] * 32), k), (THREADS,),
                        (meta["nfix"], k, a["fix_rows"], a["fix_lo"], a["fix_hi"], carry, out))


def _balanced(f, cost_note):
    """The reason a load-balancing kernel is not offered when the longest row is within
    MERGE_MIN_SKEW means (the row kernels need no balancing), else None."""
    if f.row_max <= MERGE_MIN_SKEW * max(f.row_mean, 1.0):
        return (f"rows are balanced (longest {f.row_max} <= {MERGE_MIN_SKEW} x mean {f.row_mean:.1f}): "
                f"the row kernels need no load balancing and {cost_note}")
    return None


class CsrSplit(_SpMV):
    """CSR vector with the long rows cut into chunks of SPLIT_CHUNK nonzeros, a block each.

    For skewed rows (web graphs, R-MAT): the short rows stream as in CSR vector (W lanes a row),
    the hub rows, which would keep one lane group busy for their whole length, are summed by
    whole blocks; the block that completes a row adds its chunk sums in chunk order (spmv.cu):
    one launch, deterministic. Prepare lists the long rows' chunks (array operations on the GPU);
    A's own arrays are read at run. The chunk sums and the rows' tickets (counters that only grow)
    are kept per CUDA stream and k, so calls on one stream reuse them and streams never share them.
    """
    name = "spmv.csr_split"
    #: SpMV only: for k columns it streams A k times, like CSR vector; the SpMM kernels read A once
    #: per 4-32 columns (on skewed-large float32 k = 16 it took 3.5 ms against csr_merge's 1.07,
    #: H100 2026-11-24, 6d19572)
    ops = ("spmv",)
    deterministic = True
    reads_a_at_run = True

    def supports(self, f):
        return _balanced(f, "cutting long rows only adds work")

    def candidates(self, f, device):
        return _width_candidates(f)

    def cost(self, f, params, device):
        v, i = self._sizes(f)
        w = int(params["W"])
        limit = fmt.split_limit(w)
        trips = np.ceil(min(f.row_max, limit) / (UNROLL * w))
        nbytes = f.nnz * (v + i) * f.k + 2 * f.m * i + traffic.dense_bytes(f)
        return Cost(self._convert_s(f.m * 8, 6, device), self._time(nbytes, device, 1, trips, f.m * w * f.k),
                    f"{w} lanes per row up to {limit} nonzeros, longer rows in blocks of "
                    f"{fmt.SPLIT_CHUNK} (longest {f.row_max}): no straggler past {int(trips)} trips")

    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        w = _choice(params, "W", 2, fmt.VECTOR_WIDTHS)
        limit = fmt.split_limit(w)
        sc = fmt.split_chunks(indptr, limit, xp=_cupy())
        fns = functions(data.dtype, indices.dtype)
        ct, it = _cuda.ctype(data.dtype), _cuda.ctype(indices.dtype)
        arrays = dict(indptr=indptr, indices=indices, data=data,
                      **{name: sc[name] for name in ("chunk_lo", "chunk_hi", "chunk_row", "fix_rows", "fix_lo", "fix_hi")})
        return self._prepared(dict(params, W=w), arrays, A.shape, data.dtype,
                              launch=_packed(fns, f"csr_split<{ct},{it},{w}>", indices.dtype),
                              m=A.shape[0], limit=limit, nchunks=int(sc["nchunks"]),
                              grid_x=int(sc["nchunks"]) + _grid(A.shape[0] * w), scratch={})

    def _launch(self, p, B, out, k):
        cp = _cupy()
        a, meta = p.arrays, p.meta
        key = (cp.cuda.get_current_stream().ptr, k)
        scratch = meta["scratch"].get(key)
        if scratch is None:      # chunk sums and tickets of this stream (zeroed once)
            scratch = meta["scratch"][key] = (cp.empty(max(1, meta["nchunks"] * k), dtype=out.dtype),
                                              cp.zeros(max(1, a["fix_rows"].shape[0] * k), dtype=cp.uint64))
        meta["launch"]((meta["grid_x"], k), (THREADS,),
                       (meta["m"], k, a["indptr"], a["indices"], a["data"], B, out, meta["limit"], meta["nchunks"],
                        a["chunk_lo"], a["chunk_hi"], a["chunk_row"], a["fix_rows"], a["fix_lo"], a["fix_hi"],
                        *scratch))


KERNELS = (CsrScalar(), CsrVector(), CsrSpmm(), Ellr(), Brc(), Brcp(), CsrMerge(), CsrSplit())
for _k in KERNELS:
    register(_k)
