"""matplan: plans and runs GPU matrix products (SpMV/SpMM, SpGEMM, tall-and-skinny GEMM).

    from matplan import planner
    plan = planner.plan(A, B)   # statistics -> candidate kernels -> predicted costs -> Plan
    print(plan)                 # the choice, the figures behind it, why
    C = plan.run(A, B)          # CuPy kernels on the GPU; SciPy/NumPy on the host
    C = matplan.matmul(A, B)    # plan (cached by A's fingerprint) + run; see matplan.dispatch
"""
from .core.cache import cache_info, clear_all as clear_caches
from .core.version import __version__
from .dispatch import get_plan_cache, matmul, show_plan_cache_info
from .planner import Plan, plan

__all__ = ["plan", "Plan", "matmul", "cache_info", "clear_caches", "get_plan_cache", "show_plan_cache_info", "__version__"]
