"""The planner: statistics, candidate scoring and the immutable Plan."""
from ..core import features as stats
from . import measure
from .choose import TIE_MARGIN, plan, plan_transpose
from .plan import BoundPlan, Plan
from ..core.types import Candidate

__all__ = ["plan", "plan_transpose", "Plan", "BoundPlan", "Candidate", "stats", "measure", "TIE_MARGIN"]
