"""Auto-dispatch: ``matplan.matmul`` with a plan cache, LinearOperators, and routing of other libraries' products.

    C = matplan.matmul(A, B)                  # plan once per distinct A (fingerprint), reuse after
    matplan.get_plan_cache().show_info()      # this thread's cache for the current device
    op = plan.as_linear_operator(A)           # SciPy / cupyx LinearOperator through the bound plan
    with matplan.dispatch.route_sparse_matmul():
        x, info = scipy.sparse.linalg.cg(A, b)   # A.dot / A @ x inside SciPy run matplan.matmul

Modules: fingerprint (the cache key, digests of A where it lives, and what a
hit checks), identity (the fast path of a hit: identity key, formats that are
A's own arrays, the fused GPU comparison), cache (per thread, per device, LRU by
count and bytes), auto (matmul), linop
(LinearOperator), routing (the dispatch hook and its protocol).
"""
from .auto import REPLAN_FACTOR, matmul
from .cache import DEFAULT_MEMSIZE, DEFAULT_SIZE, PlanCache, get_plan_cache, show_plan_cache_info
from .fingerprint import Fingerprint
from ..planner.linop import linear_operator
from .routing import is_routing, route_sparse_matmul, skip_routing

__all__ = ["matmul", "get_plan_cache", "show_plan_cache_info", "PlanCache", "Fingerprint",
           "linear_operator", "route_sparse_matmul", "skip_routing", "is_routing", "REPLAN_FACTOR",
           "DEFAULT_SIZE", "DEFAULT_MEMSIZE"]
