"""The planner: statistics, candidate scoring and the immutable Plan."""
from . import stats
from . import measure
from .choose import TIE_MARGIN, plan
from .plan import BoundPlan, Candidate, Plan

__all__ = ["plan", "Plan", "BoundPlan", "Candidate", "stats", "measure", "TIE_MARGIN"]
