"""Least-squares refits of the analytic models' fitted constants, on chosen timings.

Some analytic constants are least-squares fits to tuning timings: the prepared cuSPARSE SpMV/SpMM
call's efficiencies and fixed cost, the hash SpGEMM's effective bytes (per product, nonzero of C,
nonzero of C from hash tables and row) and one-pass fixed costs, the cuSPARSE SpGEMM effective
bytes, the segmented merge SpGEMM's fixed, per-round, per-product and per-product-round costs, the
blocked (BRC/BRCP) SpMM gather bytes and fixed cost, cuBLAS's tall-and-skinny efficiencies and
fixed costs (gemv, gemm) and TSM2's fixed cost; three are read off the timings otherwise: the
hash SpGEMM's first-call excess, its two passes' fixed cost (from the smallest two-pass calls) and
TSM2's column walk (0 in a fold without walk-bound column-kernel timings). ``matplan report``
refits them in every leave-family-out fold on the training families' timings (:func:`fit`) and
scores the held-out family with them (:func:`installed`), so no held-out timing reaches its own
prediction. The shipped constants (the modules' values) are what ``matplan train`` and the
planner use.

Each cost is linear in its constants, or in their inverse (an efficiency divides the bytes), so a
fold's fit is a non-negative least squares of relative error (each timing weighted by 1 / its
measured time, as the shipped constants were fitted): the cost with every refit constant at 0 and
at each unit value gives the design. A least-squares constant no training timing depends on
keeps its value.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from ..kernels import get
from ..kernels.spgemm.kernel import hash_path
from ..kernels.tsgemm.launch import column_walk
from ..models import spgemm as spgemm_model
from ..models import spmv as spmv_model
from ..models import tsgemm as tsgemm_model


@dataclasses.dataclass(frozen=True)
class Constant:
    """One refit constant: ``module.name`` (indexed by ``path`` into a dict or tuple); ``inverse``:
    the cost is linear in 1 / value (an efficiency), which is what the fit solves for."""
    module: object
    name: str
    path: tuple = ()
    inverse: bool = False

    @property
    def label(self) -> str:
        return f"{self.module.__name__.rsplit('.', 1)[-1]}.{self.name}" + "".join(f"[{k}]" for k in self.path)

    def get(self) -> float:
        v = getattr(self.module, self.name)
        for k in self.path:
            v = v[k]
        return float(v)

    def set(self, value: float) -> None:
        setattr(self.module, self.name, _replaced(getattr(self.module, self.name), self.path, value))

    def coefficient(self) -> float:
        """The linear coefficient of the cost: the value, or its inverse."""
        v = self.get()
        return 1.0 / v if self.inverse else v

    def set_coefficient(self, c: float) -> None:
        self.set((1.0 / c if c > 0 else float("inf")) if self.inverse else c)


def _replaced(container, path, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(container, dict):
        return {**container, head: _replaced(container[head], rest, value)}
    items = list(container)
    items[head] = _replaced(items[head], rest, value)
    return tuple(items)


@dataclasses.dataclass(frozen=True)
class Group:
    """Constants fitted together on the timings of ``kernels`` (those ``selects`` keeps, by features):
    by a least squares of run time, or, with ``read_off``, by that function of (dataset, the
    group's rows) -> {label: value} (constants the cost does not take linearly)."""
    name: str
    kernels: tuple
    constants: tuple
    selects: object = None
    read_off: object = None

    def uses(self, f) -> bool:
        return self.selects is None or self.selects(f)


def _spmm(f) -> bool:
    return f.k > 1


def _hash_first_extra(ds, rows) -> dict:
    """HASH_FIRST_EXTRA_S: the median preparation (a first call's excess, :mod:`.dataset`) of the
    rows on the one-pass paths; none such: the value stays."""
    smem = ds.device.smem_per_block
    extra = [r.prepare_s for r in rows if spgemm_model.one_pass(hash_path(ds.features(r.problem), smem))]
    return {"spgemm.HASH_FIRST_EXTRA_S": float(np.median(extra))} if extra else {}


#: The fold's two-pass products read off for that path's fixed cost: those of at most this many
#: times the fewest products (the smallest calls, where the fixed cost is most of the time).
TWO_PASSES_SMALLEST = 2.0


def _two_passes_fixed(ds, rows) -> dict:
    """HASH_FIXED_S["two passes"] (host time of the symbolic pass's launches and round trips),
    read off the fold's smallest two-pass calls: the median of their time over the path's
    modelled time without it. None such: the shipped value stays."""
    smem = ds.device.smem_per_block
    two = [r for r in rows if hash_path(ds.features(r.problem), smem) == "two passes"]
    if not two:
        return {}
    fewest = min(ds.features(r.problem).products for r in two)
    small = [r for r in two if ds.features(r.problem).products <= TWO_PASSES_SMALLEST * fewest]
    with installed({"spgemm.HASH_FIXED_S[two passes]": 0.0}):
        excess = [r.run_s - get(r.kernel).cost(ds.features(r.problem), r.params, ds.device).run_s for r in small]
    return {"spgemm.HASH_FIXED_S[two passes]": max(0.0, float(np.median(excess)))}


def _column_walk(ds, rows) -> dict:
    """COL_COLUMN_S, read off the column kernel's timings whose walk bounds the call: per timing,
    its time over cuBLAS's on the same problem plus cuBLAS's modelled time (the call's fixed host
    and launch cost cancels), over the columns a thread walks (:func:`column_walk`); the median of
    those whose walk at that rate passes the paper's model time. None such: 0 (the model alone)."""
    cublas = {r.problem: r.run_s for r in ds.rows if r.kernel == "gemm.cublas" and r.run_s > 0}
    rates = []
    with installed({"tsgemm.COL_COLUMN_S": 0.0}):
        for r in rows:
            if r.params.get("layout") != "col" or r.problem not in cublas:
                continue
            f = ds.features(r.problem)
            columns = column_walk(f.m, f.n, np.dtype(f.dtype).itemsize, r.params["t1"], r.params["t2"],
                                  r.params["t3"], ds.device.sms)
            model = get(r.kernel).cost(f, r.params, ds.device).run_s - tsgemm_model.LAUNCH_S
            vendor = get("gemm.cublas").cost(f, {}, ds.device).run_s - tsgemm_model.LAUNCH_S
            rate = (r.run_s - cublas[r.problem] + vendor) / columns
            if rate * columns > model:
                rates.append(rate)
    return {"tsgemm.COL_COLUMN_S": float(np.median(rates)) if rates else 0.0}


_DTYPES = ("float32", "float64")
#: The hash paths whose fixed cost is a least-squares fit: the one-pass ones, which problems of
#: every size take. The two passes' is read off their smallest calls (_two_passes_fixed), the
#: hybrid's is not refit (the few problems on those paths are too large for a least squares).
_HASH_FITTED_PATHS = ("one pass, direct", "one pass, balanced", "one pass, grouped")
GROUPS = (
    Group("vendor SpMV/SpMM (spmv.cusparse)", ("spmv.cusparse",), (
        Constant(spmv_model, "CUSPARSE_PREPARED_SPMV_EFFICIENCY", inverse=True),
        Constant(spmv_model, "CUSPARSE_PREPARED_SPMM_EFFICIENCY", inverse=True),
        Constant(spmv_model, "CUSPARSE_PREPARED_OVERHEAD_S"))),
    Group("blocked SpMM (spmv.brc, spmv.brcp at k > 1)", ("spmv.brc", "spmv.brcp"), (
        Constant(spmv_model, "BLOCKED_SPMM_GATHER_BYTES"),
        Constant(spmv_model, "BLOCKED_SPMM_OVERHEAD_S")), _spmm),
    Group("hash SpGEMM (spgemm.hash)", ("spgemm.hash",), tuple(
        Constant(spgemm_model, "HASH_BYTES", (d, j)) for d in _DTYPES for j in (0, 1))
        + (Constant(spgemm_model, "HASH_TABLE_BYTES"), Constant(spgemm_model, "HASH_ROW_BYTES"))
        + tuple(Constant(spgemm_model, "HASH_FIXED_S", (path,)) for path in _HASH_FITTED_PATHS)),
    Group("vendor SpGEMM (spgemm.cusparse)", ("spgemm.cusparse",), tuple(
        Constant(spgemm_model, "CUSPARSE_SPGEMM_BYTES", (d, j)) for d in _DTYPES for j in (0, 1))
        + tuple(Constant(spgemm_model, "CUSPARSE_SPGEMM_LONG_ROW_BYTES", (d,)) for d in _DTYPES)),
    Group("merge SpGEMM (spgemm.merge)", ("spgemm.merge",), tuple(
        Constant(spgemm_model, name) for name in
        ("MERGE_FIXED_S", "MERGE_ROUND_S", "MERGE_BYTES_PER_PRODUCT", "MERGE_ROUND_BYTES"))),
    Group("hash SpGEMM first calls (spgemm.hash)", ("spgemm.hash",),
          (Constant(spgemm_model, "HASH_FIRST_EXTRA_S"),), read_off=_hash_first_extra),
    Group("hash SpGEMM's two passes (spgemm.hash)", ("spgemm.hash",),
          (Constant(spgemm_model, "HASH_FIXED_S", ("two passes",)),), read_off=_two_passes_fixed),
    Group("TSM2 column kernel's walk (tsgemm.tsm2)", ("tsgemm.tsm2",),
          (Constant(tsgemm_model, "COL_COLUMN_S"),), read_off=_column_walk),
    Group("cuBLAS tall-and-skinny (gemm.cublas)", ("gemm.cublas",), tuple(
        Constant(tsgemm_model, "CUBLAS_TS_EFFICIENCY", (d,), inverse=True) for d in _DTYPES)
        + tuple(Constant(tsgemm_model, "CUBLAS_TS_FIXED_S", (p,)) for p in ("gemv", "gemm")),
          lambda f: f.op == "tsgemm"),
    Group("TSM2's fixed cost (tsgemm.tsm2)", ("tsgemm.tsm2",), (Constant(tsgemm_model, "TSM2_FIXED_S"),)),
)


def current(groups=GROUPS) -> dict:
    """{label: value} of the constants as they are now (the shipped ones outside :func:`installed`)."""
    return {label: c.get() for label, c in _by_label(groups).items()}


#: (constants by label, the values they had) of each enclosing :func:`installed`, outermost first.
_REPLACED: list = []


def _by_label(groups=GROUPS) -> dict:
    return {c.label: c for g in groups for c in g.constants}


@contextlib.contextmanager
def _set(values: dict, by_label: dict):
    """The constants of ``values`` set for the ``with`` block, yielding the values they replaced."""
    old = {label: by_label[label].get() for label in values}
    try:
        for label, v in values.items():
            by_label[label].set(float(v))
        yield old
    finally:
        for label, v in old.items():
            by_label[label].set(v)


@contextlib.contextmanager
def installed(values: dict, groups=GROUPS):
    """For the ``with`` block, the constants named in ``values`` (by label) set to them; restored after."""
    by_label = _by_label(groups)
    unknown = sorted(set(values) - set(by_label))
    if unknown:
        raise ValueError(f"values: unknown constants {unknown}; expected labels of {sorted(by_label)}")
    with _set(values, by_label) as old:
        _REPLACED.append((by_label, old))
        try:
            yield
        finally:
            _REPLACED.pop()


@contextlib.contextmanager
def shipped():
    """For the ``with`` block, the constants every enclosing :func:`installed` replaced back at their
    shipped values: an online calibration's ratio is measured over the shipped model's time, so a
    calibrated cost is scaled from it whatever a fold installed (:mod:`.calibration`)."""
    constants, values = {}, {}
    for by_label, old in reversed(_REPLACED):   # the outermost's values last: the shipped ones
        constants.update(by_label)
        values.update(old)
    with _set(values, constants):
        yield


def _run_s(ds, rows) -> np.ndarray:
    return np.array([get(r.kernel).cost(ds.features(r.problem), r.params, ds.device).run_s for r in rows])


def _costed(ds, row) -> bool:
    """Whether the kernel's cost model prices ``row`` (a kernel past its limits rejects it)."""
    try:
        get(row.kernel).cost(ds.features(row.problem), row.params, ds.device)
    except Exception:  # noqa: BLE001  such a row says nothing of the constants
        return False
    return True


def fit_group(ds, idx, group) -> dict:
    """{label: value} of ``group``'s constants fitted on rows ``idx`` of ``ds`` (relative non-negative
    least squares of run time); constants no row depends on, or a group with too few rows, keep
    their current values."""
    from scipy.optimize import nnls   # SciPy: only to fit
    keep = {c.label: c.get() for c in group.constants}
    rows = [ds.rows[i] for i in idx if ds.rows[i].kernel in group.kernels
            and ds.rows[i].run_s > 0 and group.uses(ds.features(ds.rows[i].problem)) and _costed(ds, ds.rows[i])]
    if group.read_off is not None:
        return {**keep, **group.read_off(ds, rows)}
    if len(rows) <= len(group.constants):
        return keep
    y = np.array([r.run_s for r in rows])
    base = {c.label: 0.0 for c in group.constants}
    with installed({label: (float("inf") if c.inverse else 0.0)
                    for c, label in zip(group.constants, base)}, (group,)):
        t0 = _run_s(ds, rows)
        design = []
        for c in group.constants:
            c.set_coefficient(1.0)
            design.append(_run_s(ds, rows) - t0)
            c.set_coefficient(0.0)
    A = np.stack(design, axis=1)
    used = np.flatnonzero(np.any(np.abs(A) > 0, axis=0))
    if not len(used) or not np.all(np.isfinite(A)) or not np.all(np.isfinite(t0)):
        return keep
    scale = np.abs(A[:, used]).max(axis=0)
    coef, _ = nnls(A[:, used] / scale / y[:, None], (y - t0) / y)
    out = dict(keep)
    for j, c in zip(used, coef / scale):
        con = group.constants[j]
        if c > 0 or not con.inverse:
            out[con.label] = (1.0 / c) if con.inverse else float(c)
    return out


def fit(ds, idx=None, groups=GROUPS) -> dict:
    """{label: value} of every group's constants fitted on rows ``idx`` of ``ds`` (all rows if None)."""
    idx = range(len(ds)) if idx is None else idx
    out = {}
    for g in groups:
        out.update(fit_group(ds, list(idx), g))
    return out


__all__ = ["shipped", "Constant", "Group", "GROUPS", "current", "installed", "fit", "fit_group"]
