"""Verbatim copies of the SpGEMM cost functions as they were before their parts were computed once
(spgemm.hash's describe_groups, hash_path and cost; models.spgemm's hash_seconds, hash_terms and
values_replay_seconds, every term through the public functions), with the first-call excess
added since: the tests check the current functions against them, figure for figure and text for
text."""
import math

import numpy as np

from matplan.core.types import Cost
from matplan.kernels.spgemm import global_rows, panels, rules
from matplan.models import spgemm as spgemm_model, traffic


def reference_describe_groups(f, smem_bytes):
    itemsize = np.dtype(f.dtype).itemsize
    ladder = rules.table_ladder(smem_bytes, rules.KEY_BYTES + itemsize)
    balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
    alpha_max = f.rowct_max / spgemm_model.RBS_COMPRESSION
    n_global = 0
    if min(alpha_max, f.k) > ladder[-1]:
        n_global = max(1, f.rbs_groups[-1] if f.rbs_groups else 1) if alpha_max > 4 * ladder[-1] else 1
    groups = ", ".join(f"{c:,} rows alpha in [{lo},{hi})" for lo, hi, c in
                       zip(spgemm_model.RBS_GROUP_BOUNDS, spgemm_model.RBS_GROUP_BOUNDS[1:] + ("inf",),
                           f.rbs_groups) if c)
    mode = (f"balanced (var/mean of nnz_RowCt {f.rowct_var_over_mean:.2f} <= "
            f"{spgemm_model.RBS_BALANCED_RATIO}): one table size" if balanced else
            f"grouped (var/mean {f.rowct_var_over_mean:.2f} > {spgemm_model.RBS_BALANCED_RATIO}): {groups}")
    glob = (f"largest row alpha = {alpha_max:,.0f} exceeds the {ladder[-1]}-slot shared table, so about "
            f"{n_global} row(s) go to the global-memory path" if n_global else
            f"every row fits a shared table (largest {ladder[-1]} slots, alpha max {alpha_max:,.0f})")
    return balanced, f"{mode}; {glob}", n_global


def reference_hash_path(f, smem_bytes):
    itemsize = np.dtype(f.dtype).itemsize
    top = rules.table_ladder(smem_bytes, rules.KEY_BYTES + itemsize)[-1]
    caps = rules.esc_caps(f.k)
    if rules.one_pass_table(f.rowct_max, f.k, top, f.products, itemsize, total_bytes=math.inf,
                            esc_cap=(caps or (0,))[-1]):
        balanced = spgemm_model.rbsparse_balanced(f.rowct_var_over_mean)
        return "one pass, balanced" if balanced else "one pass, grouped"
    long_rows = sum(f.rbs_groups[4:]) if len(f.rbs_groups) > 4 else f.m
    if rules.one_pass_long(long_rows, f.k, f.products, itemsize, total_bytes=math.inf):
        return "one pass, grouped"
    if caps and long_rows <= spgemm_model.HYBRID_LONG_ROWS * f.m and f.rowct_max / spgemm_model.RBS_COMPRESSION <= top:
        return "hybrid"
    return "two passes"


def reference_hash_cost(f, device, free):
    """HashSpGEMM.cost as it was, ``free`` the device's free bytes it asked for (None: not asked)."""
    itemsize = np.dtype(f.dtype).itemsize
    balanced, why, n_global = reference_describe_groups(f, device.smem_per_block)
    path = reference_hash_path(f, device.smem_per_block)
    slab_bytes = 0.0
    seg = (global_rows.global_seg_shape(f.k, itemsize, device.smem_per_block, n_global, device.sms)
           if n_global else None)
    if n_global and seg is None:
        slab_bytes = n_global * f.k * (rules.KEY_BYTES + itemsize) * 2
        why += f" (dense slabs of {f.k:,} columns in global memory)"
    elif n_global:
        why += f" (by {seg[1]} column segment(s) of {seg[0]:,} columns in shared memory)"
    launches = 2 * (1 if balanced else sum(1 for c in f.rbs_groups if c)) + (2 if n_global else 0)
    caps = rules.esc_caps(f.k)
    direct = bool(caps) and f.rowct_max <= caps[-1]
    t = reference_hash_seconds(f, device, path, launches, slab_bytes, direct)
    _, panels_why = panels.predict_panels(traffic.spgemm_nnz_c(f), f.m, itemsize, free)
    sort = ("" if not caps else
            f"; every row sorted in registers (numeric_esc: at most {caps[-1]} products a row)"
            if f.rowct_max <= caps[-1] else
            f"; rows of at most {caps[-1]} products sorted in registers (numeric_esc), the others hashed")
    fixed = spgemm_model.HASH_FIXED_S[spgemm_model.hash_fixed_key(path, direct)]
    first = spgemm_model.HASH_FIRST_EXTRA_S if path.startswith("one pass") else 0.0   # added since
    return Cost(first, t, f"RBSparse hash, {path}{', direct' if direct and path.startswith('one pass') else ''} "
                          f"({fixed * 1e3:.2f} ms fixed), "
                          f"{why}{sort}; {reference_hash_terms(f, path, direct)}"
                          + (f"; {panels_why}" if panels_why else "")
                + (f"; a first call {first * 1e3:.2f} ms more (no guessed analysis to go on from)" if first else "")
                + f"; a plan's runs from the third on an unchanged pattern replay values only "
                  f"(~{reference_values_replay_seconds(f, device) * 1e3:.3f} ms where its kept bytes fit)")


def reference_hash_seconds(f, device, path, launches, slab_bytes=0.0, direct=False):
    nbytes, _, _ = spgemm_model.fitted_bytes(f, spgemm_model.HASH_BYTES)
    nbytes += (spgemm_model.hash_table_nnz(f, path, direct) * spgemm_model.HASH_TABLE_BYTES
               + f.m * spgemm_model.HASH_ROW_BYTES)
    t = (nbytes + slab_bytes) / device.mem_bandwidth
    return t + spgemm_model.HASH_FIXED_S[spgemm_model.hash_fixed_key(path, direct)] + launches * spgemm_model.LAUNCH_S


def reference_hash_terms(f, path, direct):
    per_product, per_output = traffic.for_dtype(spgemm_model.HASH_BYTES, f)
    tables = spgemm_model.hash_table_nnz(f, path, direct)
    return (f"~{traffic.spgemm_nnz_c(f):,.0f} nonzeros of C expected ({spgemm_model.compression_text(f)}); "
            f"{per_product:.0f} B per product + {per_output:.0f} B per nonzero of C"
            + (f" + {spgemm_model.HASH_TABLE_BYTES:.0f} B per nonzero of C from hash tables" if tables else
               " (all from numeric_esc)")
            + f" + {spgemm_model.HASH_ROW_BYTES:.0f} B per row at the copy bandwidth")


def reference_values_replay_seconds(f, device):
    item = 4 if str(f.dtype) == "float32" else 8
    nbytes = f.products * (8 + item / 2) + traffic.spgemm_nnz_c(f) * (4 + item + 16)
    return nbytes / device.mem_bandwidth + spgemm_model.VALUES_FIXED_S
