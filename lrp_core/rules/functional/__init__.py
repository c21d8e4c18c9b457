"""Relevance propagation rules on plain tensors.

Every rule takes the forward quantities of one operation and the relevance of
its output, and returns the relevance of its input(s). Relevance flows from the
output to the input; shapes are those of the forward tensors.

The functions are the reference formulas of ``docs/METHODS.md`` §1. The rule
objects of :mod:`lrp_core.rules.composites` wrap them, and a composite maps each
operation of a relevance pass to one of them; the course calls the functions
directly. By operation: :mod:`.basics` (the stabilised ratio, the generic rule), :mod:`.linear`,
:mod:`.sums` (Adds, sums, Clones, selections, products), :mod:`.maps` (zᴮ, the rotation); the replay's tensor
utilities they share are in :mod:`lrp_core.rules.tensors`.
"""

from ..tensors import apply_rotary, query_row_bias, repeat_kv, rotate_half, take_rows
from .basics import EPS, generic, safe_div
from .linear import linear_baseline, linear_epsilon, linear_gamma, linear_gamma_factors, linear_generic, linear_signed
from .maps import rotary_transpose, zbox_conv2d
from .sums import (
    add_generic,
    add_generic_n,
    add_normalized,
    add_normalized_n,
    clone,
    identity,
    matmul,
    select,
    sum_generic,
    sum_normalized,
    weighted_sum,
)

__all__ = [
    "EPS",
    "safe_div",
    "generic",
    "linear_signed",
    "linear_baseline",
    "linear_generic",
    "linear_gamma_factors",
    "linear_gamma",
    "linear_epsilon",
    "add_generic",
    "add_normalized",
    "add_generic_n",
    "add_normalized_n",
    "sum_generic",
    "sum_normalized",
    "clone",
    "select",
    "weighted_sum",
    "matmul",
    "identity",
    "zbox_conv2d",
    "rotate_half",
    "apply_rotary",
    "rotary_transpose",
    "repeat_kv",
    "take_rows",
    "query_row_bias",
]
