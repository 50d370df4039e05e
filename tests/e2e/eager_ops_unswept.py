"""Paddle's eager op entry points, and which of them the eager sweep exercises.

The eager op list is the public callables of ``paddle.base.core.eager.ops``
(what ``paddle._C_ops`` re-exports in dygraph mode; ``paddle._C_ops`` also
re-exports ``core.pir.ops``, whose extra names are PIR-only and not callable
eagerly, so they are not counted).  Names are dropped from the list, by rule:

- ``private``: a leading underscore, non-callables (the ``legacy`` submodule),
  and the ``get_core_ops_*`` introspection helpers;
- ``grad``: ``_grad`` anywhere in the name (backward entry points; the sweep
  reaches backward kernels through ``loss.backward()``, not by name);
- ``sparse``: the ``sparse_`` prefix (SparseCooTensor/SparseCsrTensor ops);
- ``fused``: ``fused``/``fusion`` in the name (fusion-pass ops), and the
  ``onednn``/``mkldnn``/``xpu`` names;
- ``distributed``: collective and MoE/dispatch ops (``c_*``, ``all_gather``,
  ``all_reduce``, ``moe_*``, ``sync_*``, ...: see ``DIST_PREFIXES``).

What is left is "Paddle's eager op list".  Each entry is also marked with
``cpu_kernel``: whether a phi kernel of the op's name (or, for an in-place
``x_``, of ``x``) is registered for the CPU backend.  Ops without one are either
GPU-only (flash_attn, fp8, weight_only_linear, ...) or composite ops whose
kernels carry another name (ones -> full, det -> determinant); they stay in the
list and are reported separately, so nothing is dropped silently.

"Covered" is measured by the sweep (``eager_sweep.py``): it wraps every callable
of ``paddle._C_ops`` while the cases run and records the names called, and it
turns on Paddle's own operator statistics (``FLAGS_low_precision_op_list``,
what ``paddle.amp.debugging.collect_operator_stats`` uses), which records the
ops that the C++ paths (Tensor operators, ``__getitem__``/``__setitem__``)
dispatch without going through ``paddle._C_ops``; those names are legacy
operator names and are mapped to phi names with ``core._get_phi_kernel_name``.

Run standalone on a sweep result to print the list of ops not in the sample::

    python tests/e2e/eager_ops_unswept.py out.json
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from typing import Any

DIST_PREFIXES = (
    "c_", "all_gather", "all_reduce", "all_to_all", "broadcast", "reduce_scatter",
    "p_send", "p_recv", "send_v2", "recv_v2", "partial_", "dist_", "dtensor_",
    "global_gather", "global_scatter", "mp_allreduce", "barrier", "sync_", "moe_",
    "shard_", "reshard", "distributed_", "limit_by_capacity", "number_count",
    "assign_pos", "prune_gate_by_capacity", "random_routing", "build_src_rank",
    "expand_modality_expert_id", "cal_aux_loss",
)  # fmt: skip
DIST_EXACT = {"reduce", "send_and_recv"}


def classify(name: str) -> str | None:
    """The rule that drops ``name`` from the eager op list, or None to keep it."""
    if name.startswith("_") or name.startswith("get_core_ops_"):
        return "private"
    if "_grad" in name:
        return "grad"
    if name.startswith("sparse_"):
        return "sparse"
    if re.search(r"fused|fusion|onednn|mkldnn|xpu", name):
        return "fused"
    if name in DIST_EXACT or name.startswith(DIST_PREFIXES):
        return "distributed"
    return None


def eager_op_list() -> dict[str, Any]:
    """``{"ops": {name: {"cpu_kernel": bool}}, "dropped": {rule: [names]}}``."""
    from paddle.base import core

    kernels = core._get_registered_phi_kernels("all")
    cpu = {n for n, keys in kernels.items() if any(k.startswith("(CPU,") for k in keys)}
    ops: dict[str, dict[str, bool]] = {}
    dropped: dict[str, list[str]] = {}
    for name in sorted(dir(core.eager.ops)):
        if name.startswith("__"):
            continue
        rule = "private" if not callable(getattr(core.eager.ops, name)) else classify(name)
        if rule is not None:
            dropped.setdefault(rule, []).append(name)
            continue
        base = name[:-1] if name.endswith("_") else name
        ops[name] = {"cpu_kernel": name in cpu or base in cpu}
    return {"ops": ops, "dropped": dropped}


def legacy_to_phi(names: set[str]) -> set[str]:
    """Map operator-statistics names (legacy operator names) to phi op names."""
    from paddle.base import core

    out = set()
    for n in names:
        out.add(n)
        with contextlib.suppress(Exception):
            out.add(core._get_phi_kernel_name(n))
    return out


def coverage(op_list: dict[str, Any], called: set[str], stats_phi: set[str]) -> dict[str, Any]:
    """Which listed ops were exercised: called through ``paddle._C_ops`` or seen by
    Paddle's operator statistics (``stats_phi``: already mapped by ``legacy_to_phi``).
    An in-place ``x_`` counts only if ``x_`` itself was called (the statistics do
    not tell ``x_`` from ``x``)."""
    ops = op_list["ops"]
    covered: dict[str, str] = {}
    for name in ops:
        if name in called:
            covered[name] = "_C_ops"
        elif name in stats_phi and not name.endswith("_"):
            covered[name] = "op_stats"
    unswept = sorted(n for n in ops if n not in covered)
    return {
        "n_ops": len(ops),
        "n_ops_cpu_kernel": sum(1 for v in ops.values() if v["cpu_kernel"]),
        "n_covered": len(covered),
        "n_covered_cpu_kernel": sum(1 for n in covered if ops[n]["cpu_kernel"]),
        "n_covered_via_C_ops": sum(1 for v in covered.values() if v == "_C_ops"),
        "covered": dict(sorted(covered.items())),
        "unswept": unswept,
        "unswept_cpu_kernel": [n for n in unswept if ops[n]["cpu_kernel"]],
        "unswept_no_cpu_kernel": [n for n in unswept if not ops[n]["cpu_kernel"]],
        "dropped_counts": {k: len(v) for k, v in op_list["dropped"].items()},
    }


def format_report(cov: dict[str, Any], width: int = 100) -> str:
    import textwrap

    lines = [
        f"Paddle eager op list: {cov['n_ops']} ops ({cov['n_ops_cpu_kernel']} with a CPU kernel "
        f"of that name); dropped by rule: {cov['dropped_counts']}",
        f"exercised by the sample: {cov['n_covered']} ({cov['n_covered_via_C_ops']} through "
        f"paddle._C_ops, the rest seen only by Paddle's operator statistics); "
        f"{cov['n_covered_cpu_kernel']} of the {cov['n_ops_cpu_kernel']} with a CPU kernel",
        f"NOT in the sample, with a CPU kernel ({len(cov['unswept_cpu_kernel'])}):",
        textwrap.fill(" ".join(cov["unswept_cpu_kernel"]), width, initial_indent="  ",
                      subsequent_indent="  "),
        f"NOT in the sample, no CPU kernel of that name ({len(cov['unswept_no_cpu_kernel'])}):",
        textwrap.fill(" ".join(cov["unswept_no_cpu_kernel"]), width, initial_indent="  ",
                      subsequent_indent="  "),
    ]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: eager_ops_unswept.py SWEEP_RESULT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        data = json.load(f)
    print(format_report(data["coverage"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
