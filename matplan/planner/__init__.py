"""The planner: statistics, candidate scoring and the immutable Plan.

choose.py   scores the candidates (analytic or learned costs), picks one, explains why
measure.py  times the finalists on the GPU when the models cannot separate them
plan.py     plan() and plan_transpose(), the Plan and the BoundPlan
linop.py    SciPy / cupyx LinearOperators over a bound plan
"""
from ..core import features as stats
from ..core.types import Candidate
from ..kernels import statistics as _statistics  # noqa: F401  installs the GPU statistics kernel in core.figures
from . import measure
from .choose import TIE_MARGIN
from .plan import BoundPlan, Plan, plan, plan_transpose

__all__ = ["plan", "plan_transpose", "Plan", "BoundPlan", "Candidate", "stats", "measure", "TIE_MARGIN"]
