"""The types the layers share: a model's predicted ``Cost`` and the planner's scored ``Candidate``."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Cost:
    """Predicted seconds: one-off format conversion, and one application."""
    prepare_s: float
    run_s: float
    why: str = ""
    #: True when run_s is scaled by a timing of this kernel on the device for this problem class
    #: (the planner's measurements, installed by the tuning database): the learned model keeps it.
    calibrated: bool = False

    def total(self, reuse: int) -> float:
        """Cost per application when the conversion is amortised over ``reuse`` applications."""
        return self.prepare_s / max(reuse, 1) + self.run_s


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One (kernel, params) the planner considered, with its predicted cost."""
    kernel: str
    params: dict
    prepare_s: float
    run_s: float
    total_s: float               # run_s + prepare_s / reuse
    source: str                  # "analytic" | "learned" | "measured" | "rejected"
    why: str = ""

    def label(self) -> str:
        if not self.params:
            return self.kernel
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.kernel}[{inner}]"
