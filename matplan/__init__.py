"""matplan: plans and runs GPU matrix products (SpMV/SpMM, SpGEMM, tall-and-skinny GEMM).

    from matplan import planner
    plan = planner.plan(A, B)   # statistics -> candidate kernels -> predicted costs -> Plan
    print(plan)                 # the choice, the figures behind it, why
    C = plan.run(A, B)          # CuPy kernels on the GPU; SciPy/NumPy on the host
    C = matplan.matmul(A, B)    # plan (cached by A's fingerprint) + run; see matplan.dispatch

Importing matplan loads nothing heavy: the planner, the kernels, CuPy, SciPy and the models load
on first use of a name below (PEP 562), so a library that imports matplan for auto-dispatch pays
for it only when it dispatches.
"""
import importlib

from .core.version import __version__

#: Public name -> (module, attribute), imported on first access.
_LAZY = {"plan": ("planner", "plan"), "Plan": ("planner", "Plan"), "matmul": ("dispatch", "matmul"),
         "get_plan_cache": ("dispatch", "get_plan_cache"),
         "show_plan_cache_info": ("dispatch", "show_plan_cache_info"),
         "cache_info": ("core.cache", "cache_info"), "clear_caches": ("core.cache", "clear_all")}

#: Subpackages reachable as attributes (``matplan.planner.plan_transpose``) once asked for.
_SUBPACKAGES = {"core", "corpus", "models", "kernels", "planner", "dispatch", "tuning_db", "distributed"}

__all__ = ["plan", "Plan", "matmul", "cache_info", "clear_caches", "get_plan_cache", "show_plan_cache_info",
           "__version__"]


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
