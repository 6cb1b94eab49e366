"""The ``spgemm.hash`` Kernel: candidates, cost (the fitted constants and formulas of
matplan.models.spgemm, the path and groups from the kernels' own rules) and run."""
from __future__ import annotations

import functools
import math

import numpy as np

from ...core.types import Cost
from ...core.xp import cupy_module
from ...models import spgemm as spgemm_model
from ..base import KeepsA
from ..registry import register
import matplan.kernels.spgemm.global_rows as global_rows
import matplan.kernels.spgemm.panels as panels
import matplan.kernels.spgemm.rules as rules
import matplan.kernels.spgemm.runtime as runtime
from .product import spgemm


def describe_groups(f, smem_bytes: int) -> tuple:
    """(balanced, text, predicted global rows) from the planner's features, for cost() and why."""
    ladder = rules.table_ladder(smem_bytes, rules.KEY_BYTES + _itemsize(f.dtype))
    balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
    return (balanced,) + _groups(f, ladder, balanced)


def _groups(f, ladder: tuple, balanced: bool) -> tuple:
    """describe_groups' (text, predicted global rows) for the numeric table ``ladder`` and the
    RBSparse rule's verdict (the groups named only where they are not balanced)."""
    alpha_max = f.rowct_max / spgemm_model.RBS_COMPRESSION
    n_global = 0
    if min(alpha_max, f.k) > ladder[-1]:
        n_global = max(1, f.rbs_groups[-1] if f.rbs_groups else 1) if alpha_max > 4 * ladder[-1] else 1
    if balanced:
        mode = (f"balanced (var/mean of nnz_RowCt {f.rowct_var_over_mean:.2f} <= "
                f"{spgemm_model.RBS_BALANCED_RATIO}): one table size")
    else:
        groups = ", ".join(f"{c:,} rows alpha in [{lo},{hi})" for lo, hi, c in
                           zip(spgemm_model.RBS_GROUP_BOUNDS, spgemm_model.RBS_GROUP_BOUNDS[1:] + ("inf",),
                               f.rbs_groups) if c)
        mode = f"grouped (var/mean {f.rowct_var_over_mean:.2f} > {spgemm_model.RBS_BALANCED_RATIO}): {groups}"
    glob = (f"largest row alpha = {alpha_max:,.0f} exceeds the {ladder[-1]}-slot shared table, so about "
            f"{n_global} row(s) go to the global-memory path" if n_global else
            f"every row fits a shared table (largest {ladder[-1]} slots, alpha max {alpha_max:,.0f})")
    return f"{mode}; {glob}", n_global


def hash_path(f, smem_bytes: int) -> str:
    """The path spgemm() takes for the planner's features (a key of models.spgemm.HASH_FIXED_S): one
    pass where rules.one_pass_table allows (its device-memory bound is left out: it binds only past ~300M products
    on an 80 GB GPU, where the fixed cost no longer matters, and the planner's features must not
    depend on the memory of the machine that computes them), balanced or grouped by the RBSparse
    rule; grouped also when the long rows (alpha past 256: about nnz_RowCt > 804, the features'
    nearest bound to the one-pass classes' 512) are few enough for rules.one_pass_long; else the
    hybrid when few rows are long (models.spgemm.HYBRID_LONG_ROWS) and none passes the shared tables; else two
    passes."""
    itemsize = _itemsize(f.dtype)
    top = rules.table_ladder(smem_bytes, rules.KEY_BYTES + itemsize)[-1]
    return _path(f, itemsize, top, rules.esc_caps(f.k), spgemm_model.rbsparse_balanced(f.rowct_var_over_mean))


def _path(f, itemsize: int, top: int, caps: tuple, balanced: bool) -> str:
    """hash_path's path from the largest numeric table ``top``, numeric_esc's classes for B's
    columns (``caps``) and the RBSparse rule's verdict."""
    if rules.one_pass_table(f.rowct_max, f.k, top, f.products, itemsize, total_bytes=math.inf,
                            esc_cap=(caps or (0,))[-1]):
        return "one pass, balanced" if balanced else "one pass, grouped"
    long_rows = sum(f.rbs_groups[4:]) if len(f.rbs_groups) > 4 else f.m
    if rules.one_pass_long(long_rows, f.k, f.products, itemsize, total_bytes=math.inf):
        return "one pass, grouped"
    if caps and long_rows <= spgemm_model.HYBRID_LONG_ROWS * f.m and f.rowct_max / spgemm_model.RBS_COMPRESSION <= top:
        return "hybrid"
    return "two passes"


@functools.lru_cache(maxsize=16)
def _itemsize(dtype: str) -> int:
    """Bytes of a value of ``dtype`` (a Features.dtype name), once per dtype."""
    return np.dtype(dtype).itemsize


def _free_bytes(nnz_c: float, m: int, itemsize: int) -> int | None:
    """The device's free bytes (a driver query, ~5-15 us of host time) for the panels' prediction
    where spgemm() itself asks for them: C of ``nnz_c`` nonzeros and ``m`` rows past
    runtime.SMALL_OUTPUT_FRACTION of the device's memory; below it spgemm() leaves a shortage to
    CuPy (no refusal to predict), so None (predict_panels: device memory not known)."""
    if panels.panel_bytes(nnz_c, m + 1, itemsize) <= runtime.SMALL_OUTPUT_FRACTION * runtime._device_total_bytes():
        return None
    return runtime._free_device_bytes()


class SparseProduct(KeepsA):
    """A GPU SpGEMM kernel of ours: prepare keeps A (KeepsA), run computes A @ B by
    :meth:`product` (no ``out``: C's sparsity is not known in advance)."""

    def product(self, A, B, params):
        raise NotImplementedError

    def run(self, prepared, B, out=None):
        if out is not None:
            raise ValueError("out: not supported for spgemm (the output's sparsity is not known in advance)")
        return self.product(prepared.arrays["A"], B, prepared.params)


class HashSpGEMM(SparseProduct):
    name = "spgemm.hash"
    ops = ("spgemm",)
    backend = "gpu"
    deterministic = False   # atomicAdd order varies run to run
    reads_a_at_run = True   # prepare keeps A; spgemm() analyses A and B anew on every call

    def candidates(self, features, device):
        yield {"sort": True}

    def cost(self, f, params, device):
        itemsize = _itemsize(f.dtype)
        ladder = rules.table_ladder(device.smem_per_block, rules.KEY_BYTES + itemsize)
        balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
        caps = rules.esc_caps(f.k)
        why, n_global = _groups(f, ladder, balanced)
        path = _path(f, itemsize, ladder[-1], caps, balanced)
        slab_bytes = 0.0
        seg = (global_rows.global_seg_shape(f.k, itemsize, device.smem_per_block, n_global, device.sms)
               if n_global else None)
        if n_global and seg is None:   # dense slabs of B.shape[1] columns, written and scanned
            slab_bytes = n_global * f.k * (rules.KEY_BYTES + itemsize) * 2
            why += f" (dense slabs of {f.k:,} columns in global memory)"
        elif n_global:   # by segments in shared memory: the products' traffic covers them
            why += f" (by {seg[1]} column segment(s) of {seg[0]:,} columns in shared memory)"
        launches = 2 * (1 if balanced else sum(1 for c in f.rbs_groups if c)) + (2 if n_global else 0)
        direct = bool(caps) and f.rowct_max <= caps[-1]   # every row numeric_esc's: C written in place
        t, terms, replay_s, nnz_c = spgemm_model.hash_cost_parts(f, device, path, launches, slab_bytes, direct)
        free = _free_bytes(nnz_c, f.m, itemsize) if device.source == "measured" and cupy_module() is not None else None
        _, panels_why = panels.predict_panels(nnz_c, f.m, itemsize, free)
        sort = ("" if not caps else
                f"; every row sorted in registers (numeric_esc: at most {caps[-1]} products a row)"
                if f.rowct_max <= caps[-1] else
                f"; rows of at most {caps[-1]} products sorted in registers (numeric_esc), the others hashed")
        fixed = spgemm_model.HASH_FIXED_S[spgemm_model.hash_fixed_key(path, direct)]
        first = spgemm_model.HASH_FIRST_EXTRA_S if spgemm_model.one_pass(path) else 0.0
        return Cost(first, t, f"RBSparse hash, {path}{', direct' if direct and spgemm_model.one_pass(path) else ''} "
                            f"({fixed * 1e3:.2f} ms fixed), "
                            f"{why}{sort}; {terms}"
                            + (f"; {panels_why}" if panels_why else "")
                    + (f"; a first call {first * 1e3:.2f} ms more (no guessed analysis to go on from)"
                       if first else "")
                    + f"; a plan's runs from the third on an unchanged pattern replay values only "
                      f"(~{replay_s * 1e3:.3f} ms where its kept bytes fit)")

    def product(self, A, B, params):
        # a plan's repeated runs on an unchanged pattern replay C's values only (guesses.py)
        return spgemm(A, B, sort=params.get("sort", True), values=True)

    def tuning_calls(self, prepared, B):
        """run: repeated calls that replay the guessed analysis but compute C's pattern (what
        :meth:`cost` prices; a plan's runs from the third replay values only, faster still);
        first: a call that guesses nothing (guess=False), what a plan's first run pays."""
        A, sort = prepared.arrays["A"], prepared.params.get("sort", True)
        return {"run": lambda: spgemm(A, B, sort=sort), "first": lambda: spgemm(A, B, sort=sort, guess=False)}


register(HashSpGEMM())
