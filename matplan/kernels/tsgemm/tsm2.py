"""TSM2 tall-and-skinny GEMM (SEEDS section 5): C (m x k) = A (m x n) . B (n x k) for small k.

The kernel the planner sees, ``tsgemm.tsm2``: its candidates and costs come from the model
(:mod:`.rules`, :mod:`matplan.models.tsgemm`) and never touch the GPU; the planner's
measurement (:mod:`matplan.planner.measure`) times the configs of :meth:`TSM2.search_space`
(block sizes, t3 multiples, the row kernel's depth, the cp.async and 3xTF32 kernels) and keeps
the fastest, cached by the shape bucket :meth:`TSM2.measure_key`. A plan's params say which of
the three kernels runs: the register kernels of ``tsm2.cu`` (:mod:`.launch`), the cp.async
kernels (``"async"``: :mod:`.tsm2_async`) or the 3xTF32 kernel (``"tc"``: :mod:`.tsm2_tc`).

A view of A with neither unit stride is rejected with a clear error (the planner routes it to
cuBLAS). A B without unit column stride is copied (it is n x k, small); A never is. A prepared
TSM2 keeps one launch per k and strides, so a plan's run only launches.
"""
from __future__ import annotations

import numpy as np

from ...core.cache import BoundedCache
from ...core.types import Cost
from ...core.xp import cupy_module
from ...models import tsgemm as tsgemm_model
from ...models.tsgemm import LAUNCH_S
from ..base import Kernel, Prepared
from ..registry import register
from .configs import TSM2Config, async_config, default, search_space
from .. import _cuda
from .launch import SOURCE as REGISTER_SOURCE, Launch, column_walk, config_module
from .rules import bucket_of_features, layout_of, layout_of_features, model_params, model_time
from .tsm2_async import (SOURCE as ASYNC_SOURCE, AsyncLaunch, allocator_bvec, check_a as async_check_a,
                         kernel_name as async_kernel_name)
from .tsm2_tc import SOURCE as TC_SOURCE, TcLaunch, _names as tc_names, check_a as tc_check_a

#: Launch decisions (:class:`.launch.Launch`, tsm2_async.AsyncLaunch, tsm2_tc.TcLaunch) by
#: everything they depend on: the device, A's shape, dtype, layout, leading dimension and
#: alignment, B's and C's strides and alignment, k and the parameters. Kept across prepared
#: inputs, so ``plan.run``, which prepares A on every call, pays them once (they cost 40-180 us
#: of host time a call on an H100 host, n = 8192-16384). A launch holds no buffers: sharing one
#: between threads is safe.
LAUNCH_CACHE_SIZE = 512
_LAUNCHES = BoundedCache("tsgemm.launches", LAUNCH_CACHE_SIZE)
#: Spare Cs by shape, dtype, device and stream (:func:`_launch_kept`), at most SPARE_CACHE_SIZE
#: in the process however many plans run.
SPARE_CACHE_SIZE = 4
_SPARES = BoundedCache("tsgemm.spares", SPARE_CACHE_SIZE)


class TSM2(Kernel):
    name = "tsgemm.tsm2"
    reads_a_at_run = True
    ops = ("tsgemm",)
    backend = "gpu"
    deterministic = True   # no atomics: each element of C is one fixed-order sum
    #: What its timings depend on besides the library versions (the planner's measurement cache
    #: key hashes them; paths under matplan/kernels).
    sources = ("tsgemm/tsm2.cu", "tsgemm/tsm2_async.cu", "tsgemm/tsm2_tc.cu", "tsgemm/launch.py",
               "tsgemm/tsm2_async.py", "tsgemm/tsm2_tc.py", "tsgemm/rules.py")

    def supports(self, f):
        if layout_of_features(f) is None:
            return (f"A is a non-contiguous view (layout {f.layout!r}); TSM2 is planned for C- or "
                    f"F-ordered A only")
        if f.k < 1 or f.m < 1 or f.n < 1:
            return "empty product"
        if max(f.m, f.n, f.k) >= 2 ** 31:
            return "a dimension is 2**31 or more (the kernels index rows with 32-bit counts)"
        return None

    def candidates(self, f, device):
        """The model's config (no timing); the planner's measurement widens it to :meth:`search_space`."""
        yield default(device, f).params()

    def search_space(self, f, device):
        """Every config the planner's measurement times for these features (configs.search_space)."""
        return [c.params() for c in search_space(device, f)]

    def ready(self, f, params) -> bool:
        """Whether running ``params`` for these features on the current GPU compiles nothing (its
        kernel is loaded, prebuilt or compiled here before): the planner times only such configs."""
        module = _module_of(f, params)
        return module is not None and _cuda.available(*module)

    def modules(self, f, params) -> tuple:
        """The module of ``params``' kernel (tsm2.cu's register kernels: one module a (t2, t3,
        vector width, groups, steps, depth), the ones a tuning run compiles; the cp.async and
        tensor-core kernels'); () where its block size does not fit."""
        module = _module_of(f, params)
        return () if module is None else ((*module, ()),)

    def measure_key(self, f):
        """The shape bucket the planner's measurement keeps this kernel's timings by (rules.bucket)."""
        return bucket_of_features(f)

    def cost(self, f, params, device):
        mp = model_params(device, f)
        c = TSM2Config.of(params)
        t = model_time(device, f.m, f.n, f.k, f.dtype, c.layout, c.t1, c.t2, c.t3)
        columns = (column_walk(f.m, f.n, np.dtype(f.dtype).itemsize, c.t1, c.t2, c.t3, device.sms)
                   if c.layout == "col" else 0)
        walk = columns * tsgemm_model.COL_COLUMN_S
        k, thr = f.k, mp["t2threshold"]
        why = (f"TSM2 {c.layout}-major kernel: k={k} {'<=' if k <= thr else '>'} "
               f"t2threshold={thr:.1f} ({mp['bound']}-bound); model t2={mp['t2']}, t3={mp['t3']} "
               f"(kernel t2={c.t2}, t3={c.t3}), predicted memory utilisation "
               f"{mp['util_mem']:.2f}, compute utilisation {mp['util_comp']:.2f}, "
               f"{t * 1e3:.4f} ms; {c.label()}")
        if c.async_variant:
            why += f"; the cp.async kernel (tsm2_async, knobs {c.async_variant!r})"
        if c.tc_variant:
            why += (f"; the 3xTF32 tensor-core kernel (tsm2_tc {c.tc_variant!r}; "
                    f"MATPLAN_TF32X3=0 turns it off)")
        if walk > t:
            why += (f"; too few rows to fill the GPU: its threads' walk over their {columns:,} "
                    f"columns of A bounds the call ({walk * 1e3:.4f} ms)")
        return Cost(0.0, max(t, walk) + LAUNCH_S + tsgemm_model.TSM2_FIXED_S, why)

    def prepare(self, A, params):
        layout, lda = layout_of(A)
        if layout != params["layout"]:
            raise ValueError(f"A: this plan's TSM2 kernel is for {params['layout']}-major A, got "
                             f"{layout}-major A; make a new plan for this layout")
        if params.get("async"):
            async_check_a(A, layout == "col")   # ValueError naming A when not 16-byte aligned
        if params.get("tc"):
            tc_check_a(A, layout)
        return Prepared(self.name, dict(params), {"A": A}, A.shape, A.dtype,
                        meta={"layout": layout, "lda": lda})

    def run(self, prepared, B, out=None):
        """C = A @ B for the prepared A. A B (and out) of shapes, strides, dtype and alignment seen
        before with this prepared A goes straight to its kept launch: in a single call the GPU
        waits for the host's work before the launch (H100 host, n = 8192: a call's host time
        11.2-12.5 -> 8.2-8.9 us, against a kernel of ~95 us in float32). Its C, with out None, is
        one that an earlier such call allocated after launching (:func:`_launch_kept`)."""
        cp = cupy_module()
        A = prepared.arrays["A"]
        kept = prepared.meta.setdefault("kept", {})
        key = _kept_key(cp, B, out)
        go = kept.get(key) if key is not None else None
        if go is not None:
            return _launch_kept(cp, go, A, B, out)
        m, n = A.shape
        p = prepared.params
        vector = B.ndim == 1
        B2 = B.reshape(-1, 1) if vector else B
        if B2.shape[0] != n:
            raise ValueError(f"B: expected {n} rows to match A ({m}x{n}), got {B2.shape[0]}")
        if B2.dtype != A.dtype:
            raise ValueError(f"B: dtype {B2.dtype} does not match A's {A.dtype}")
        k = B2.shape[1]
        if not _b_as_is(B2, bool(p.get("async"))):
            B2 = cp.ascontiguousarray(B2)   # n x k: small; A is never copied
        shape = (m,) if vector else (m, k)
        C = cp.empty(shape, dtype=A.dtype) if out is None else _check_out(out, shape, A.dtype)
        C2 = C[:, None] if vector else C
        if m == 0 or k == 0:
            return C
        if n == 0:
            C2.fill(0)
            return C
        go = _launch_for(A, B2, C2, p, prepared.meta["layout"], prepared.meta["lda"])
        go(A, B2, C2)
        if key is not None and B2 is B and C2 is C:   # launched on B and C as they are: keep it
            _keep(kept, key, go)
        return C

    def runner(self, params):
        """``Plan.run``'s call: the first call for each A layout and alignment and B / out layout
        (:func:`_kept_key`) goes through prepare and run; later ones only launch, with the launch
        run kept, which saves the 5-7 us of prepare and run's checks on a host where a call's
        whole host time is 12-28 us (H100). What is kept, and when, is run's rule."""
        general = super().runner(params)
        cp = cupy_module()
        if cp is None:
            return general
        p, kept = dict(params), {}

        def run(A, B, out=None):
            b_key = _kept_key(cp, B, out)
            key = None if b_key is None else (A.strides, A.data.ptr % 16, b_key)
            go = kept.get(key) if key is not None else None
            if go is not None:
                return _launch_kept(cp, go, A, B, out)
            prepared = self.prepare(A, p)
            C = self.run(prepared, B, out=out)
            go = prepared.meta["kept"].get(b_key) if key is not None else None
            if go is not None:
                _keep(kept, key, go)
            return C
        return run


def _module_of(f, params) -> tuple | None:
    """(source file, instantiations) of the module running ``params`` on these features loads,
    or None where its block size's B tile does not fit (launch.module_names' ValueError)."""
    c = TSM2Config.of(params)
    col = c.layout == "col"
    if c.async_variant:
        cfg = async_config(f.dtype, f.k, c.async_variant, c.layout)
        bv = allocator_bvec(cfg, np.dtype(f.dtype).itemsize, f.k, col)
        return ASYNC_SOURCE, (async_kernel_name(f.dtype, cfg, bv, col),)
    if c.tc_variant:
        return TC_SOURCE, tc_names()
    try:   # t2 at most k, as the launch takes it (_launch_for)
        return REGISTER_SOURCE, config_module(c.layout, f.dtype, f.n if c.layout == "row" else f.m, c.t1,
                                              min(c.t2, f.k), c.t3, c.depth)
    except ValueError:
        return None


def _launch_kept(cp, go, A, B, out):
    """``go(A, B, C)`` with C = out, or else a C that an earlier kept call of this shape and dtype
    on this device and stream allocated after its own launch (_SPARES): a single call's
    allocation (4-12 us of host time on H100 hosts) then overlaps the GPU's work of the earlier
    call instead of delaying this launch. A spare is handed out once (``pop``: no two threads
    share one); the stream is in the key because CuPy's pool reuses memory by the stream it was
    taken on."""
    if out is not None:
        go(A, B, out)
        return out
    shape = (A.shape[0], B.shape[1])
    key = (shape, A.dtype.char, cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)
    C = _SPARES.pop(key)
    if C is None:
        C = cp.empty(shape, dtype=A.dtype)
    go(A, B, C)
    _SPARES.put(key, cp.empty(shape, dtype=A.dtype))
    return C


def _kept_key(cp, B, out):
    """What run's checks and launch depend on besides the prepared A and the parameters: the
    device, B's shape, dtype, strides and 16-byte alignment, and out's shape, dtype and strides;
    None (never kept) unless B and out are 2-D CuPy arrays (or out is None)."""
    if type(B) is not cp.ndarray or B.ndim != 2 or not (out is None or type(out) is cp.ndarray):
        return None
    return (cp.cuda.runtime.getDevice(), B.shape, B.dtype.char, B.strides, B.data.ptr % 16,
            None if out is None else (out.shape, out.dtype.char, out.strides))


def _b_as_is(B2, contiguous: bool) -> bool:
    """Whether the kernels read this n x k B without a copy: unit stride along its rows, rows not
    overlapping, and C-contiguous where ``contiguous`` (the cp.async kernel)."""
    return (B2.strides[1] == B2.itemsize and B2.strides[0] >= B2.shape[1] * B2.itemsize
            and (B2.flags.c_contiguous or not contiguous))


def _launch_for(A, B2, C2, p: dict, layout: str, lda: int):
    """The launch of these arrays and parameters ``p``, from _LAUNCHES or made and kept there."""
    k = B2.shape[1]
    key = (cupy_module().cuda.runtime.getDevice(), A.shape, A.dtype.char, layout, lda, A.data.ptr % 16,
           k, B2.strides, B2.data.ptr % 16, C2.strides,
           p["t1"], p["t2"], p["t3"], p.get("depth", 1), p.get("async"), p.get("tc"))
    go = _LAUNCHES.get(key)
    if go is None:
        if p.get("async"):
            go = AsyncLaunch(A, B2, C2, async_config(A.dtype, k, p["async"], layout),
                             col=layout == "col")   # A checked by TSM2.prepare
        elif p.get("tc"):
            go = TcLaunch(A, B2, C2, layout, lda, p["tc"])
        else:
            go = Launch(A, layout, lda, k, C2.strides, p["t1"], min(p["t2"], k), p["t3"], depth=p.get("depth", 1))
        _LAUNCHES.put(key, go)
    return go


def _keep(kept: dict, key, value) -> None:
    """kept[key] = value in a plan's or a prepared A's own kept launches, emptied first when it
    holds LAUNCH_CACHE_SIZE entries (the launches themselves live in _LAUNCHES)."""
    if len(kept) >= LAUNCH_CACHE_SIZE:
        kept.clear()
    kept[key] = value


def _check_out(out, shape, dtype):
    cp = cupy_module()
    if not isinstance(out, cp.ndarray):
        raise TypeError(f"out: expected a CuPy array, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(f"out: expected shape {shape} and dtype {np.dtype(dtype)}, got {out.shape} {out.dtype}")
    if any(s % out.itemsize or (s == 0 and d > 1) for s, d in zip(out.strides, out.shape)):
        raise ValueError(f"out: strides {out.strides} must be nonzero multiples of the itemsize")
    return out


register(TSM2())
