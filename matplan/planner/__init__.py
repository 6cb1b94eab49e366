"""The planner: statistics, candidate scoring and the immutable Plan."""
from . import stats
from . import measure
from .choose import TIE_MARGIN, plan, plan_transpose
from .plan import BoundPlan, Candidate, Plan

__all__ = ["plan", "plan_transpose", "Plan", "BoundPlan", "Candidate", "stats", "measure", "TIE_MARGIN"]
