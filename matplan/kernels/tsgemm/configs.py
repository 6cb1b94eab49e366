"""TSM2's configs: the typed form of its parameters and the search space the planner measures.

A :class:`TSM2Config` is what a plan's ``params`` dict says, frozen and hashable: A's layout,
block size ``t1``, columns per pass ``t2``, loads in flight ``t3``, the row kernel's ``depth``,
and, when one of them runs instead of the register kernel, the cp.async kernel's knob set
(``async``) or the 3xTF32 kernel's variant (``tc``). :func:`search_space` lists the configs the
planner's measurement times for a problem (every t1, t3 multiple and depth of the register
kernel, the cp.async variants and the tensor-core variants where they apply): a function of the
planner's features and the device spec only.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ...core.cache import BoundedCache
from .rules import (ASYNC_VARIANTS, SMALL_GRID_VARIANTS, async_eligible, default_params, depths, kernel_params,
                    layout_of_features, model_params, t1_candidates, t3_candidates, timed_rows, vector_width)
from .tsm2_async import check_config, default_config, shape_of
from .tsm2_tc import eligible as tc_eligible, threads as tc_threads, variants as tc_variants


@dataclasses.dataclass(frozen=True)
class TSM2Config:
    """One TSM2 configuration (see the module docstring); ``params()`` is its plan dict."""
    layout: str
    t1: int
    t2: int
    t3: int
    depth: int = 1
    async_variant: str | None = None
    tc_variant: str | None = None

    def params(self) -> dict:
        """The plan's params: layout, t1, t2, t3, depth (row-major A only), async or tc if set."""
        p = {"layout": self.layout, "t1": self.t1, "t2": self.t2, "t3": self.t3}
        if self.layout == "row":
            p["depth"] = self.depth
        if self.async_variant:
            p["async"] = self.async_variant
        if self.tc_variant:
            p["tc"] = self.tc_variant
        return p

    @classmethod
    def of(cls, params: dict) -> "TSM2Config":
        """The config of a plan's params dict (keys other than its fields are ignored)."""
        return cls(str(params["layout"]), int(params["t1"]), int(params["t2"]), int(params["t3"]),
                   int(params.get("depth", 1)), params.get("async") or None, params.get("tc") or None)

    def label(self) -> str:
        """'t1=256,t3=4,depth=2' for the register kernel, 'async=s3' or 'tc=d1' for the others."""
        if self.async_variant:
            return f"async={self.async_variant}"
        if self.tc_variant:
            return f"tc={self.tc_variant}"
        return f"t1={self.t1},t3={self.t3}" + (f",depth={self.depth}" if self.layout == "row" else "")


#: The knobs of an async variant per (dtype, k, variant, layout), built once for the measurement's
#: configs and the plans' launches.
_ASYNC_CONFIGS = BoundedCache("tsgemm.async_configs", 1024)


def async_config(dtype, k: int, variant: str, layout: str = "row") -> dict:
    """The cp.async kernel's knobs (tsm2_async.default_config with the variant's changes)."""
    return dict(_async_config_items(np.dtype(dtype), int(k), variant, layout))


def _async_config_items(dtype: np.dtype, k: int, variant: str, layout: str) -> tuple:
    key = (dtype, k, variant, layout)
    return _ASYNC_CONFIGS.get_or_create(key, lambda: tuple(dict(
        default_config(dtype, k, layout == "col"), **ASYNC_VARIANTS[variant]).items()))


def async_threads(dtype, k: int, variant: str, layout: str = "row") -> int:
    """Threads a block of the cp.async kernel with this variant's knobs."""
    return shape_of(async_config(dtype, k, variant, layout), np.dtype(dtype).itemsize,
                               layout == "col")["threads"]


def async_variants(dtype, k: int, layout: str, m: int, n: int) -> tuple:
    """The ASYNC_VARIANTS names the measurement tries for an m x n A: those whose knobs the kernel
    accepts and differ from every earlier variant's (``wr1`` is the preset where it already has
    one warp along the rows), SMALL_GRID_VARIANTS only for A of at most rules.timed_rows rows."""
    seen, names = set(), []
    for name in ASYNC_VARIANTS:
        if name in SMALL_GRID_VARIANTS and timed_rows(m, n) < m:
            continue
        cfg = _async_config_items(np.dtype(dtype), int(k), name, layout)
        try:
            check_config(dict(cfg), np.dtype(dtype).itemsize, layout == "col")
        except ValueError:
            continue
        if cfg not in seen:
            seen.add(cfg)
            names.append(name)
    return tuple(names)


def default(device, f) -> TSM2Config:
    """The model's config, no timing: its first block size, its t2 and t3 as the kernel of A's
    layout runs them, depth 1 (what the planner runs when it does not measure)."""
    p = default_params(device, f)
    return TSM2Config(p["layout"], p["t1"], p["t2"], p["t3"])


def search_space(device, f) -> list:
    """Every config the planner's measurement times for these features (A as the features say:
    contiguous, from CuPy's allocator, so 16-byte aligned): the register kernel's (t1, t3, depth)
    for the model's t3 and its multiples, then the cp.async variants (rules.async_eligible) and
    the 3xTF32 variants (tsm2_tc.eligible). A cp.async or tensor-core config carries its block's
    threads as t1 and the smallest t3, which the model costs it with."""
    layout = layout_of_features(f)
    mp = model_params(device, f)
    item = np.dtype(f.dtype).itemsize
    t2, t3 = kernel_params(layout, f.dtype, f.k, mp["t2"], mp["t3"])
    t1s = t1_candidates(layout, f.dtype, t2, mp["t1"])
    t3s = t3_candidates(layout, f.dtype, t2, t3)
    lda = f.n if layout == "row" else f.m
    vec = vector_width(item, True, lda, layout, t2)
    out = [TSM2Config(layout, t1, t2, t3, d) for t3 in t3s
           for d in depths(layout, item, vec, t2, t3) for t1 in t1s]
    if async_eligible(layout, f.dtype, f.k, f.m, f.n):
        out += [TSM2Config(layout, async_threads(f.dtype, f.k, v, layout), t2, min(t3s), async_variant=v)
                for v in async_variants(f.dtype, f.k, layout, f.m, f.n)]
    if tc_eligible(f.dtype, f.k, layout, f.m, f.n, device.compute_capability):
        out += [TSM2Config(layout, tc_threads(v), t2, min(t3s), tc_variant=v)
                for v in tc_variants(layout)]
    return out


__all__ = ["TSM2Config", "search_space", "default", "async_config", "async_threads", "async_variants"]
