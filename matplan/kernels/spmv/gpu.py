"""SpMV / SpMM kernels on the GPU: CSR scalar, vector, split, merge path and SpMM; ELL-R; BRC; BRCP.

The CUDA sources are in ``spmv.cu`` (one template over value and index type,
compiled once per (dtype, index type) with every kernel in it). Formats are
built by :mod:`.formats` with CuPy array operations; the launch arguments are
fixed in ``prepare`` so that ``run`` only allocates the output (``cupy.empty``)
and launches, with no host synchronisation. Costs are :mod:`matplan.models.spmv`'s,
from the layout quantities (widths, tiles, column chunks) each kernel passes.
"""
from __future__ import annotations

import functools

import numpy as np

from ...core.xp import cupy_module
from ...models import spmv as spmv_model
from .. import _cuda
from .formats import (LONG_FACTORS, MERGE_IPT, MERGE_NT, SPLIT_CHUNK, SPMM_COLUMNS, SPMM_SLOTS, VECTOR_WIDTHS,
                      WIDTH_CAP, brcp as brcp_arrays, ellr as ellr_arrays, ellr_padded_slots, merge_path,
                      result_shape, split_chunks, split_limit, spmm_columns, spmm_slots, vector_width)
from ..base import Kernel, Prepared, out_or_new
from ..registry import register

CU = "spmv/spmv.cu"
THREADS = 256
#: Merge-path SpMM: a block computes kc columns of Y from one load of its tile (spmv.cu's
#: csr_merge), kc as large as leaves this many blocks per SM (merge_columns).
MERGE_BLOCKS_PER_SM = 16
#: Columns a merge-path block computes together (csr_merge's MERGE_V) when it computes at least
#: this many: an X row's values of the chunk are fetched in one sector. Blocks of fewer columns
#: (SpMV) use the one-column instantiation, which needs fewer registers and shared memory.
#: Compiled as csr_merge<..., 1> and <..., MERGE_V> (spmv.cu instantiates 1 and 4).
MERGE_V = 4


# ------------------------------------------------------------------ compilation
def _names(ctype, itype):
    return ([f"csr_scalar<{ctype},{itype}>"]
            + [f"csr_vector<{ctype},{itype},{w}>" for w in VECTOR_WIDTHS]
            + [f"{k}<{ctype},{itype}>" for k in ("ellr", "brc", "brcp", "brcp_fixup")]
            + [f"csr_merge<{ctype},{itype},{ipt},{v}>" for ipt in MERGE_IPT for v in (1, MERGE_V)] + [f"merge_fixup<{ctype}>"]
            + [f"csr_split<{ctype},{itype},{w}>" for w in VECTOR_WIDTHS]
            + [f"csr_spmm<{ctype},{itype},{kk},{s}>" for kk in SPMM_COLUMNS for s in SPMM_SLOTS
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
        out = out_or_new(out, result_shape(prepared.shape, prepared.dtype, B), prepared.dtype, cp)
        k = 1 if B.ndim == 1 else B.shape[1]
        if m == 0 or k == 0:
            return out
        if k > 65535:
            raise ValueError(f"B: at most 65535 columns are supported, got {k}")
        if not B.flags.c_contiguous:
            B = cp.ascontiguousarray(B)
        self._launch(prepared, B, out, k)
        return out

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
    w = vector_width(f.row_mean)
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
        return spmv_model.csr_scalar(f, device)


class CsrVector(_CSR):
    """W lanes per row (W = 2..32 from the mean row length): coalesced loads, shuffle reduction."""
    name = "spmv.csr_vector"
    reads_a_at_run = True

    def candidates(self, f, device):
        return _width_candidates(f)

    def _fn_name(self, dt, it, params):
        w = _choice(params, "W", 32, VECTOR_WIDTHS)
        return f"csr_vector<{_cuda.ctype(dt)},{_cuda.ctype(it)},{w}>"

    def _threads(self, m, params):
        return m * int(params.get("W", 32))

    def cost(self, f, params, device):
        return spmv_model.csr_vector(f, int(params["W"]), device)


class CsrSpmm(_CSR):
    """SpMM (k >= 2): KK column lanes x S nonzero slots per row; each lane group reads whole rows
    of X (coalesced) and A once per KK columns, where the kernels above read A once per column."""
    name = "spmv.csr_spmm"
    ops = ("spmm",)
    reads_a_at_run = True

    def candidates(self, f, device):
        slots = vector_width(f.row_mean) // 2      # about one pass over a mean row
        for s in sorted({spmm_slots(max(1, c), f.k) for c in (slots // 2, slots, slots * 2)}):
            yield {"S": s}

    def cost(self, f, params, device):
        return spmv_model.csr_spmm(f, spmm_columns(f.k), spmm_slots(params["S"], f.k), device)

    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        s = _choice(params, "S", 1, SPMM_SLOTS)
        fns = functions(data.dtype, indices.dtype)
        ct, it = _cuda.ctype(data.dtype), _cuda.ctype(indices.dtype)
        by_columns = {kk: _packed(fns, f"csr_spmm<{ct},{it},{kk},{spmm_slots(s, kk)}>", indices.dtype)
                      for kk in SPMM_COLUMNS}
        return self._prepared(dict(params, S=s), dict(indptr=indptr, indices=indices, data=data), A.shape,
                              data.dtype, launches=by_columns, m=A.shape[0])

    def _launch(self, p, B, out, k):
        a, meta = p.arrays, p.meta
        kk = spmm_columns(k)
        group = kk * spmm_slots(p.params["S"], k)
        meta["launches"][kk]((_grid(meta["m"] * group),), (THREADS,),
                             (meta["m"], k, a["indptr"], a["indices"], a["data"], B, out))


# ------------------------------------------------------------------ ELL-R
class Ellr(_SpMV):
    """ELL column-major + row lengths, thread per row; rows sorted by length when the rule says so."""
    name = "spmv.ellr"

    def supports(self, f):
        slots = ellr_padded_slots(f.m, f.row_max)
        limit = spmv_model.ELLR_MAX_PAD_FACTOR * f.nnz + spmv_model.ELLR_MAX_PAD_EXTRA
        if slots > limit:
            return (f"padding every row to the longest ({f.row_max} vs mean {f.row_mean:.1f}) needs "
                    f"{slots:,} slots for {f.nnz:,} nonzeros (> {spmv_model.ELLR_MAX_PAD_FACTOR} x nnz + "
                    f"{spmv_model.ELLR_MAX_PAD_EXTRA:,})")
        return None

    def candidates(self, f, device):
        yield {"sorted": spmv_model.ellr_should_sort(f.warp_len_before, f.warp_len_after)}

    def cost(self, f, params, device):
        return spmv_model.ellr(f, bool(params["sorted"]), ellr_padded_slots(f.m, f.row_max), device)

    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        sort = bool(params.get("sorted", False))
        e = ellr_arrays(indptr, indices, data, sort, xp=_cupy())
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
        yield {"T": f.T, "long_factor": LONG_FACTORS[0]}
        if f.T > WIDTH_CAP or f.row_max > LONG_FACTORS[0] * f.T:
            yield {"T": min(f.T, WIDTH_CAP), "long_factor": LONG_FACTORS[1]}

    def _build(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        cp = _cupy()
        T = params.get("T")
        if T is None:
            lf = cp.diff(indptr).astype(cp.float64)
            T = spmv_model.brcp_T(float(lf.mean()), float(lf.std())) if lf.size else 1
        lf = int(params.get("long_factor", LONG_FACTORS[0]))
        params = dict(params, T=int(T), long_factor=lf)
        b = brcp_arrays(indptr, indices, data, int(T), lf, xp=cp)
        it = np.dtype(b["cols"].dtype)
        return params, b, functions(data.dtype, it), _cuda.ctype(data.dtype), _cuda.ctype(it), it


class Brc(_Blocked):
    """BRC, the BRCP paper's non-deterministic baseline: every block row atomically adds into y.

    Here on the BRCP layout (same blocks), so BRC vs BRCP isolates the reduction.
    """
    name = "spmv.brc"
    deterministic = False

    def cost(self, f, params, device):
        return spmv_model.brc(f, params["T"], params["long_factor"], device)

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
        return spmv_model.brcp(f, params["T"], params["long_factor"], device)

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
        for ipt in MERGE_IPT:
            yield {"ipt": ipt}

    def cost(self, f, params, device):
        tiles = (f.m + f.nnz) / (MERGE_NT * int(params["ipt"]))
        passes = -(-f.k // merge_columns(int(np.ceil(tiles)), f.k, device.sms))   # loads of A
        return spmv_model.csr_merge(f, tiles, passes, f"{MERGE_NT}x{params['ipt']}", device)

    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        ipt = _choice(params, "ipt", MERGE_IPT[0], MERGE_IPT)
        mp = merge_path(indptr, ipt, xp=_cupy())
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
        launch((meta["ntiles"], -(-k // kc)), (MERGE_NT,),
               (meta["m"], meta["nnz"], k, kc, a["tile_row"], a["indptr"], a["indices"], a["data"], B, out, carry))
        if meta["nfix"]:
            meta["fix"]((_grid(meta["nfix"] * 32), k), (THREADS,),
                        (meta["nfix"], k, a["fix_rows"], a["fix_lo"], a["fix_hi"], carry, out))


def _balanced(f, cost_note):
    """The reason a load-balancing kernel is not offered when the longest row is within
    spmv_model.MERGE_MIN_SKEW means (the row kernels need no balancing), else None."""
    if f.row_max <= spmv_model.MERGE_MIN_SKEW * max(f.row_mean, 1.0):
        return (f"rows are balanced (longest {f.row_max} <= {spmv_model.MERGE_MIN_SKEW} x mean {f.row_mean:.1f}): "
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
    #: per 4-32 columns (on skewed-large float32 k = 16 it took 3.5 ms against csr_merge's 1.07 on an H100)
    ops = ("spmv",)
    deterministic = True
    reads_a_at_run = True

    def supports(self, f):
        return _balanced(f, "cutting long rows only adds work")

    def candidates(self, f, device):
        return _width_candidates(f)

    def cost(self, f, params, device):
        w = int(params["W"])
        return spmv_model.csr_split(f, w, split_limit(w), SPLIT_CHUNK, device)

    def prepare(self, A, params):
        indptr, indices, data = _csr_arrays(A)
        w = _choice(params, "W", 2, VECTOR_WIDTHS)
        limit = split_limit(w)
        sc = split_chunks(indptr, limit, xp=_cupy())
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
