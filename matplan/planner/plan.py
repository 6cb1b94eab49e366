"""plan(A, B): statistics -> candidate kernels -> predicted costs (-> measured finalists) -> Plan.

The Plan is an immutable record of what was chosen, the figures behind it and why.
``plan.run(A, B)`` converts A to the chosen format and runs the kernel.
``plan.bind(A)`` converts once and returns a callable that runs on new B's:
this is how a plan made with ``reuse > 1`` pays its conversion once.

All three (``run``, ``bind``, the bound call) follow the rules of :mod:`matplan.core.validation`:
one dtype rule (operands whose NumPy promotion is the plan's dtype are cast to it), B as
``(n,)`` or ``(n, 1)`` for k = 1 with NumPy's result shape, ``out`` checked once here, and a
CSR's structure checked when a plan is made or bound and when ``run`` meets a new A
(``check=False`` skips it).
"""
from __future__ import annotations

import dataclasses
import json
import time
import warnings

import numpy as np
import scipy.sparse as sp

from ..core import device as device_mod, features as stats, validation
from ..core.features import Features
from ..core.types import Candidate
from ..core.version import __version__
from ..core.xp import cupy_module, cupyx_sparse
from ..kernels import get, kernels_for
from ..models import learned
from .choose import explain, pick, score_candidates
from .linop import linear_operator
from .measure import check_mode, refine

PLAN_FORMAT = 1
#: Ops whose A is CSR (its structure is checked), and the two that one k = 1 plan serves.
_SPARSE_A = ("spmv", "spmm", "spgemm", "sptrans")
_VECTOR_OPS = {"spmv", "spmm"}


@dataclasses.dataclass(frozen=True)
class Plan:
    op: str
    kernel: str
    params: dict
    features: Features
    candidates: tuple            # of Candidate, cheapest first; rejected ones last
    reasons: tuple               # of str
    reuse: int = 1
    deterministic: bool = False
    device: str = ""
    backend: str = "cpu"
    planning_s: float = 0.0
    version: str = ""

    def __post_init__(self):
        # the CSR operands already checked (not a field: to_dict / eq / pickle ignore it)
        object.__setattr__(self, "_checked", validation.CheckedOnce())

    # -- execution ---------------------------------------------------------
    def _kernel(self):
        return get(self.kernel)

    def _check(self, problem):
        f = self.features
        k1 = problem.B is not None and not sp.issparse(problem.B) and (problem.B.ndim == 1 or problem.B.shape[1] == 1)
        if problem.op != self.op and not ({problem.op, self.op} == _VECTOR_OPS and f.k == 1 and k1):
            raise ValueError(f"this plan is for op {self.op!r}, but (A, B) is a {problem.op!r} product")
        if problem.A.shape != (f.m, f.n):
            raise ValueError(f"A: this plan is for a {f.m}x{f.n} matrix, got {problem.A.shape[0]}x{problem.A.shape[1]}")
        if problem.backend != self.backend:
            raise ValueError(f"this plan runs on the {self.backend}, but the inputs are on the {problem.backend}")
        if str(problem.dtype) != f.dtype:
            raise ValueError(f"this plan is for {f.dtype}, got {problem.dtype}")

    def _matrix(self, A, check):
        """(A checked against the plan, cast to its dtype; A's own dtype), its CSR structure checked
        unless ``check`` is False or it is the A last checked."""
        A, a_dtype = validation.bind_matrix(A, self)
        if check and self.op in _SPARSE_A:
            self._checked.ensure(A, "A")
        return A, a_dtype

    def prepare(self, A, *, check=True):
        """Convert A to the chosen kernel's format (the cost ``reuse`` amortises)."""
        return self._kernel().prepare(self._matrix(A, check)[0], dict(self.params))

    def bind(self, A, *, check=True) -> "BoundPlan":
        """Prepare A once; the result runs ``bound(B)`` many times without converting again.

        A may have any dtype that NumPy promotes to the plan's (float32 A under a float64 plan is
        upcast once here); the bound call then takes a B whose promotion with A's dtype is the
        plan's. check=False skips the check of A's CSR structure (you vouch for it)."""
        A, a_dtype = self._matrix(A, check)
        return BoundPlan(self, self._kernel().prepare(A, dict(self.params)), a_dtype)

    def as_linear_operator(self, A):
        """SciPy (host) / cupyx (GPU) LinearOperator through ``self.bind(A)``; rmatvec via a lazy A^T plan.

        See :mod:`matplan.planner.linop` for how matvec, matmat and rmatvec run.
        """
        return linear_operator(self.bind(A), A, replan=plan)

    def run(self, A, B=None, out=None, *, check=True):
        """Compute A @ B with the chosen kernel (converting A each call; see :meth:`bind`); for a
        SpTRANS plan (:func:`matplan.planner.plan_transpose`) A.T, with no B.

        A and B are accepted when NumPy's promotion of their dtypes is the plan's dtype (then cast
        to it); for k = 1, B may be ``(n,)`` or ``(n, 1)``, and C has NumPy's shape for it. ``out``:
        exactly C's shape and the plan's dtype, on the plan's side, sharing no memory with A or B
        (:func:`matplan.core.validation.check_out`). A CSR A (and SpGEMM's B) has its structure
        checked when it is not the one last checked; check=False skips that (you vouch for it).

        Operands of exactly the types, dtype and shapes the plan was made for skip the general
        validation (``normalize``: 30-50 us of host time a call on an H100 host, as much
        as a TSM2 kernel's whole run at n = 8192) and go straight to the kernel's runner
        (``Kernel.runner``, made once per plan), which checks the rest."""
        fast = self.__dict__.get("_fast")
        if fast is None:
            fast = _fast_inputs(self) + (self._kernel().runner(dict(self.params)),)
            object.__setattr__(self, "_fast", fast)   # a cache, not a field: to_dict / eq ignore it
        a_type, b_type, dtype, a_shape, b_shape, runner = fast
        if not (type(A) is a_type and A.shape == a_shape and A.dtype == dtype
                and (B is None if b_type is None else
                     type(B) is b_type and B.shape == b_shape and B.dtype == dtype)):
            return self._run_general(A, B, out, check, runner)
        if check and self.op in _SPARSE_A:
            self._checked.ensure(A, "A")
            if self.op == "spgemm":
                self._checked.ensure(B, "B")
        if out is not None:
            validation.check_out(out, self, validation.result_shape(self, B), B, A)
        return runner(A, B, out)

    def _run_general(self, A, B, out, check, runner):
        """run() for operands off the fast path: validated (``normalize``), checked against the plan,
        B and out in the form the kernel was planned for, C in NumPy's shape for B."""
        problem = self._problem(A, B)
        self._check(problem)
        A, B = problem.A, problem.B
        if check:
            for name, M in (("A", A), ("B", B)):
                if hasattr(M, "indptr"):
                    self._checked.ensure(M, name)
        if B is None or hasattr(B, "indptr"):        # SpTRANS, SpGEMM: a new sparse C, no out
            if out is not None:
                validation.check_out(out, self, None, B, A)
            return runner(A, B, None)
        shape = validation.result_shape(self, B)
        if out is not None:
            validation.check_out(out, self, shape, B, A)
        Bk = validation.as_planned(B, self)
        C = runner(A, Bk, None if out is None else validation.as_planned(out, self))
        return out if out is not None else C if Bk is B else C.reshape(shape)

    def _problem(self, A, B):
        """(A, B) validated as a Problem of this plan's kind of operation."""
        if self.op == "sptrans":
            validation.normalize_operand(B, self)   # TypeError unless B is None
            return validation.normalize_transpose(A)
        return validation.normalize(A, B)

    def __getstate__(self):
        """Pickle the plan's fields, not the run cache (``_fast`` holds the kernel's runner, a
        closure) nor the checked operands: a plan pickled after a run unpickles and runs as one
        never run."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_fast", "_checked")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        object.__setattr__(self, "_checked", validation.CheckedOnce())

    # -- explanation -------------------------------------------------------
    def __str__(self) -> str:
        f = self.features
        lines = [f"matplan plan: {self.op} on {self.device or self.backend} ({f.dtype}), "
                 f"A {f.m}x{f.n} nnz={f.nnz:,}" + (f", k={f.k}" if self.op not in ("spmv", "sptrans") else ""),
                 f"  chosen: {self.candidates[0].label() if self.candidates else self.kernel}"
                 f"  (reuse={self.reuse}, deterministic={'required' if self.deterministic else 'not required'})",
                 "  why:"]
        lines += [f"    - {r}" for r in self.reasons]
        lines.append("  candidates (ms per application = run + prepare/reuse; predicted unless measured):")
        for c in self.candidates:
            if c.source == "rejected":
                lines.append(f"    x {c.label():<40} rejected: {c.why}")
            else:
                lines.append(f"    {'*' if c.kernel == self.kernel and c.params == self.params else ' '} "
                             f"{c.label():<40} {c.total_s * 1e3:10.4f} ms  "
                             f"(run {c.run_s * 1e3:.4f}, prepare {c.prepare_s * 1e3:.4f}; {c.source})")
        lines.append(f"  planning took {self.planning_s * 1e3:.2f} ms")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["features"] = self.features.to_dict()
        d["candidates"] = [dataclasses.asdict(c) for c in self.candidates]
        d["reasons"] = list(self.reasons)
        d["format"] = PLAN_FORMAT
        return json.loads(json.dumps(d))  # plain JSON types only

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        """The plan :meth:`to_dict` wrote; ValueError naming any missing or unknown field and the
        plan format."""
        _fields_of(d, cls, "plan")
        d = dict(d)
        fmt = d.pop("format", PLAN_FORMAT)
        if fmt != PLAN_FORMAT:
            raise ValueError(f"plan format {fmt} is not supported (expected {PLAN_FORMAT})")
        _fields_of(d["features"], Features, "plan features")
        for i, c in enumerate(d["candidates"]):
            _fields_of(c, Candidate, f"plan candidates[{i}]")
        d["features"] = Features.from_dict(d["features"])
        d["candidates"] = tuple(Candidate(**c) for c in d["candidates"])
        d["reasons"] = tuple(d["reasons"])
        return cls(**d)


def _fields_of(d, cls, what: str) -> None:
    """ValueError naming the fields of dataclass ``cls`` (those without defaults) missing from
    mapping ``d`` and the keys it has that ``cls`` lacks, with the plan format."""
    fmt = f"plan format {PLAN_FORMAT}"
    if not isinstance(d, dict):
        raise ValueError(f"{what}: expected a mapping ({fmt}), got {type(d).__name__}")
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if f.name not in d
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    unknown = sorted(set(d) - {f.name for f in fields} - ({"format"} if cls is Plan else set()))
    if missing or unknown:
        parts = ([f"missing field(s) {', '.join(missing)}"] if missing else []) + \
                ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])
        raise ValueError(f"{what}: {'; '.join(parts)} ({fmt}, as Plan.to_dict writes it)")


class BoundPlan:
    """A plan with A already converted: ``bound(B)`` runs the kernel only."""

    def __init__(self, plan: Plan, prepared, a_dtype=None):
        """``a_dtype``: the dtype of the A that was bound (before its cast to the plan's), which
        B's dtype is promoted with (:func:`matplan.core.validation.dtype_for_plan`)."""
        self.plan, self.prepared = plan, prepared
        self._kernel = plan._kernel()
        self._fast = _fast_operand_check(plan)
        shape = self._fast[2]   # C's shape on the fast path (for out)
        self._c_shape = None if shape is None else (plan.features.m,) + tuple(shape[1:])
        self._a_dtype = np.dtype(plan.features.dtype if a_dtype is None else a_dtype)
        self._checked = validation.CheckedOnce()

    def __call__(self, B=None, out=None, *, check=True):
        """A @ B on the prepared A; B, ``out`` and the result's shape as for :meth:`Plan.run`.
        check=False skips the check of a SpGEMM B's CSR structure (you vouch for it)."""
        # Fast path: a dense array of exactly the expected type, dtype and shape needs no
        # further checking (it keeps a small GPU SpMV close to one kernel launch).
        array_type, dtype, shape = self._fast
        if array_type is None or type(B) is not array_type or B.dtype != dtype or B.shape != shape:
            return self._call_general(B, out, check)
        if out is not None:
            validation.check_out(out, self.plan, self._c_shape, B, self.prepared.arrays)
        return self._kernel.run(self.prepared, B, out=out)

    def _call_general(self, B, out, check):
        B = validation.normalize_operand(B, self.plan, self._a_dtype)
        if B is None or hasattr(B, "indptr"):        # SpTRANS, SpGEMM: a new sparse C, no out
            if out is not None:
                validation.check_out(out, self.plan, None, B, None)
            if check and B is not None:
                self._checked.ensure(B, "B")
            return self._kernel.run(self.prepared, B)
        shape = validation.result_shape(self.plan, B)
        if out is not None:
            validation.check_out(out, self.plan, shape, B, self.prepared.arrays)
        Bk = validation.as_planned(B, self.plan)
        C = self._kernel.run(self.prepared, Bk, out=None if out is None else validation.as_planned(out, self.plan))
        return out if out is not None else C if Bk is B else C.reshape(shape)

    run = __call__

    def as_linear_operator(self):
        """SciPy (host) / cupyx (GPU) LinearOperator running this bound plan (no rmatvec: A is not kept)."""
        return linear_operator(self)

    @property
    def nbytes(self) -> int:
        return self.prepared.nbytes

    def __repr__(self) -> str:
        return f"<BoundPlan {self.plan.kernel} {self.plan.features.m}x{self.plan.features.n} ({self.nbytes:,} bytes prepared)>"


def _fast_inputs(plan: Plan) -> tuple:
    """(A's type, B's type, dtype, A's shape, B's shape) that ``Plan.run`` takes without the general
    validation: the plain array or CSR class of the plan's backend and exactly its shapes."""
    f = plan.features
    if plan.backend == "gpu":
        if cupy_module() is None:   # a GPU plan loaded where there is none: validation says so
            return None, None, None, None, None
        array_type, csr_type = cupy_module().ndarray, cupyx_sparse().csr_matrix
    else:
        array_type, csr_type = np.ndarray, sp.csr_matrix
    a_type = array_type if plan.op in ("tsgemm", "gemm") else csr_type
    if plan.op == "sptrans":   # no B
        return a_type, None, np.dtype(f.dtype), (f.m, f.n), None
    b_type = csr_type if plan.op == "spgemm" else array_type
    b_shape = (f.n,) if plan.op == "spmv" else (f.n, f.k)
    return a_type, b_type, np.dtype(f.dtype), (f.m, f.n), b_shape


def _fast_operand_check(plan: Plan):
    """(array type, dtype, shape) of a dense B that ``BoundPlan`` may take without validation:
    Plan.run's (_fast_inputs); a sparse B (spgemm) and SpTRANS's absent B are always validated."""
    if plan.op in ("spgemm", "sptrans"):
        return None, None, None
    _, b_type, dtype, _, b_shape = _fast_inputs(plan)
    return b_type, dtype, b_shape


def timer():
    return time.perf_counter()


def plan(A, B, *, reuse: int = 1, deterministic: bool = False, device: str | None = None,
         kernels=None, per_call=None, measure="auto", check=True) -> Plan:
    """Plan C = A @ B.

    reuse: how many times the caller will apply the plan to the same A; format
        conversion cost is divided by it.
    deterministic: admit only kernels whose output is bitwise reproducible.
    device: a known GPU name ('H100', 'K40c', ...) to plan for instead of the one in use.
    kernels: restrict the candidates to these kernel names (for experiments and tests).
    per_call: a function (kernel, features, device) -> (seconds, reason) of what each
        application pays on top of the kernel, added to its run cost and named in its why
        (``matplan.matmul`` charges the bit-for-bit check of A that a hit on a format copied
        from A needs, see ``dispatch.identity.hit_check``).
    measure: "auto" (default) times the candidates predicted within 30% of the best on (A, B)
        and chooses by the timings, those whose timing costs at most a fifth of the plan's
        predicted work (GPU only; :mod:`matplan.planner.measure`); "always" / True all such
        finalists; "never" / False keeps the models' choice.
    check: check a CSR A's (and SpGEMM B's) structure (indptr, column indices; one vectorised
        pass where A lives); False skips it for arrays you vouch for.

    The plan computes in NumPy's promotion of A's and B's dtypes; its run, bind and bound call
    accept operands that promote to it (see :mod:`matplan.core.validation`).
    """
    return _plan(lambda: validation.normalize(A, B), reuse, deterministic, device, kernels, per_call, measure,
                 check)


def plan_transpose(A, *, reuse: int = 1, deterministic: bool = False, device: str | None = None,
                   kernels=None, measure="auto", check=True) -> Plan:
    """Plan A.T as a CSR matrix (SpTRANS): ``plan.run(A)`` returns it, rows sorted by column.

    The candidates are matplan's three SpTRANS methods (sptrans.transpose: segmented sort, radix,
    segmented merge), cuSPARSE's csr2csc through CuPy (``A.T.tocsr()``) and SciPy on the host;
    the choice follows A's longest column (the segmented sort's per-row sorts) and its columns'
    count (the radix method's passes). The arguments are :func:`plan`'s.
    """
    return _plan(lambda: validation.normalize_transpose(A), reuse, deterministic, device, kernels, None, measure,
                 check)


def _plan(problem_of, reuse, deterministic, device, kernels, per_call, measure, check=True) -> Plan:
    """plan() and plan_transpose(): the arguments checked, the problem validated (``problem_of()``)
    and its CSR structure checked, statistics, scores, measurement, the Plan."""
    reuse = validation.check_int(reuse, "reuse", "a positive integer (applications of the plan to the same A)")
    mode = check_mode(measure)
    t0 = timer()
    problem = problem_of()
    if check:
        validation.check_structure(problem)
    dev = device_mod.current(device)
    ignored = _device_ignored(device, problem.backend)
    feats = stats.compute(problem, dev, detail=_reads_detailed_statistics(problem, dev, kernels))
    scored, rejected = score_candidates(feats, dev, reuse, deterministic, kernels, per_call)
    if not scored:
        raise RuntimeError(f"no kernel can run {problem.op} on the {problem.backend} for these inputs: "
                           + "; ".join(f"{c.kernel}: {c.why}" for c in rejected))
    scored, note = refine(problem, feats, dev, scored, mode, reuse, device is not None,
                          _per_call_s(per_call, feats, dev))
    best = scored[0] if note else pick(scored)
    reasons = explain(feats, best, scored, reuse, deterministic) + [n for n in (note, ignored) if n]
    ordered = tuple([best] + [c for c in scored if c is not best] + rejected)
    made = Plan(op=problem.op, kernel=best.kernel, params=best.params, features=feats,
                candidates=ordered, reasons=tuple(reasons), reuse=reuse, deterministic=deterministic,
                device=dev.name if problem.backend == "gpu" else "host (NumPy/SciPy)",
                backend=problem.backend, planning_s=timer() - t0, version=__version__)
    if check:   # its run and bind need not check these operands again
        for name, M in (("A", problem.A), ("B", problem.B)):
            if hasattr(M, "indptr"):
                made._checked.remember(M, name)
    return made


def _reads_detailed_statistics(problem, dev, kernels) -> bool:
    """Whether any candidate (or a learned model) reads more than sizes and row moments: host
    plans, whose one kernel costs bytes, skip measuring the rest."""
    if problem.backend == "gpu" or learned.model_for(problem.backend, dev) is not None:
        return True
    return any(k.reads_detailed_statistics(problem.op) for k in kernels_for(problem.op, problem.backend)
               if kernels is None or k.name in kernels)


def _device_ignored(device, backend) -> str:
    """The note (also warned) that ``device`` does not apply to host inputs; '' when it applies."""
    if device is None or backend == "gpu":
        return ""
    note = (f"device={device!r} ignored: the inputs are on the host, so this is the host's plan "
            "(NumPy/SciPy); pass CuPy arrays to plan for a GPU")
    warnings.warn(note, UserWarning, stacklevel=4)
    return note


def _per_call_s(per_call, feats, dev):
    """kernel name -> the seconds ``per_call`` adds to each of its applications (0 without it)."""
    if per_call is None:
        return lambda name: 0.0
    return lambda name: per_call(get(name), feats, dev)[0]
