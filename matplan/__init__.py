"""matplan: plans and runs GPU matrix products (SpMV/SpMM, SpGEMM, tall-and-skinny GEMM).

    from matplan import planner
    plan = planner.plan(A, B)   # statistics -> candidate kernels -> predicted costs -> Plan
    print(plan)                 # the choice, the figures behind it, why
    C = plan.run(A, B)          # CuPy kernels on the GPU; SciPy/NumPy on the host
    C = matplan.matmul(A, B)    # plan (cached by A's fingerprint) + run; see matplan.dispatch
"""
__version__ = "0.1.0"

from .core.cache import cache_info, clear_all as clear_caches  # noqa: E402
from .planner import Plan, plan  # noqa: E402
from .dispatch import get_plan_cache, matmul, show_plan_cache_info  # noqa: E402

__all__ = ["plan", "Plan", "matmul", "cache_info", "clear_caches", "get_plan_cache", "show_plan_cache_info", "__version__"]
