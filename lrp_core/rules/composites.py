"""Composites: the one place where a relevance rule is chosen.

Every operation of the replay (:class:`lrp_core.adapters.replay.Replay`: blocks, readout, input layer) asks a
:class:`Composite` for the rule of its operation kind (:data:`lrp_core.ops.OP_KINDS`) and calls it, so a new
rule set is a new composite and nothing else (zennit's design). The rule contracts are in :mod:`lrp_core.rules.ops`,
the rules themselves in :mod:`lrp_core.rules.explicit` (explicit passes) and :mod:`lrp_core.rules.gradient`
(modified-gradient replays).

A composite holds rules of one kind only and knows which pass it serves (``Composite.serves``, checked when
it is built); each pass refuses a composite of the other kind at once (:class:`~lrp_core.errors.RuleSetError`).
Besides the operation kind, a composite can choose a rule by the module's qualified name in the model
(``names``: fnmatch patterns, zennit's name map) or for the first layer of a kind in input order (``first``,
zennit's first-layer map).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Mapping, Optional

from torch import nn

from ..errors import RuleSetError, UnknownNameError
from .explicit import (
    BaselineLinear,
    Clone,
    GenericAdd,
    GenericSum,
    HalvedMatMul,
    HalvedProduct,
    Identity,
    NoExplicitFusedAttention,
    NormalizedAdd,
    NormalizedSum,
    Rotary,
    Routing,
    Select,
    SharedHeads,
    SignedLinear,
    WeightedSum,
    ZBox,
)
from .gradient import (
    DetachedGate,
    DetachedOperands,
    DetachedRMSNorm,
    DetachedStdLayerNorm,
    FusedAttentionCP,
    FusedAttentionCPHalved,
    FusedAttentionLRP,
    Gradient,
    HalvedGradient,
    IdentityRule,
    PositionalAdd,
    PositionalRotary,
    PositionLeaves,
)
from .ops import (
    ADD,
    ATTENTION,
    CLONE,
    ELEMENTWISE,
    EXPERT_SUM,
    EXPLICIT,
    GATE_MUL,
    KV_REPEAT,
    LAYER_KINDS,
    LAYERNORM,
    LINEAR,
    MASK_ADD,
    MATMUL_AV,
    MATMUL_QK,
    MODIFIED_GRADIENT,
    OP_KINDS,
    PASS_KINDS,
    PATCH_CONV,
    POOL,
    POS_ADD,
    READOUT,
    RMSNORM,
    ROPE,
    ROUTE,
    SCALE,
    SOFTMAX,
    ExplicitRule,
    GradientRule,
    Rule,
)


# ----------------------------------------------------------------------------
# composites
# ----------------------------------------------------------------------------
@dataclass
class Composite:
    """A rule set: which rule each operation of one kind of pass gets.

    Attributes:
        name: names the rule set in messages and in ``Explanation.options``.
        rules: operation kind (:data:`OP_KINDS`) → rule, for every kind the pass meets (zennit's layer map).
        names: fnmatch pattern on the module's qualified name in the model (``"head"``,
            ``"blocks.*.mlp.*"``) → rule, overriding ``rules`` (zennit's name map). A pattern's rule is taken
            only for operations of a kind it serves (``Rule.kinds``: ``"blocks.*.mlp.*"`` with a Linear rule
            reaches fc1 and fc2, not the GELU between them); the first such matching pattern wins.
        first: layer kind (:data:`LAYER_KINDS`) → rule for the first module of that kind in input order
            (zennit's first-layer map; a layer used again, as ALBERT's shared layer, keeps it at every use).
        serves: the kind of pass the rules serve (:data:`PASS_KINDS`), found when the composite is built.

    Precedence: ``names``, then ``first``, then ``rules``. Refused when built (:class:`RuleSetError`, naming the
    rule, the operation and what is accepted): rules of both kinds of pass, a rule of neither kind, a rule for
    an operation kind outside its ``kinds``, an unknown kind, a ``first`` entry for a kind without modules.
    :meth:`unused` says which ``names`` / ``first`` entries chose no rule in the passes run so far.
    """

    name: str
    rules: Mapping[str, Rule]
    names: Mapping[str, Rule] = field(default_factory=dict)
    first: Mapping[str, Rule] = field(default_factory=dict)
    serves: str = field(init=False, default="")
    #: the ``names`` patterns / ``first`` kinds that chose a rule, and every named operation asked (name → kind)
    _chosen: set = field(init=False, default_factory=set, repr=False, compare=False)
    _asked: dict = field(init=False, default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.serves = _pass_served(self)
        for kind, rule in self.rules.items():
            if kind not in OP_KINDS:
                raise RuleSetError(
                    f"composite {self.name!r}: unknown operation kind {kind!r} (for {rule!r}); the "
                    f"kinds are {', '.join(OP_KINDS)}"
                )
            _check_kind(self, rule, kind, f"operation {kind!r}")
        odd = [k for k in self.first if k not in LAYER_KINDS]
        if odd:
            raise RuleSetError(
                f"composite {self.name!r}: 'first' names the first layer of a kind, but {odd} have no "
                f"module; it accepts {', '.join(LAYER_KINDS)}"
            )
        for kind, rule in self.first.items():
            _check_kind(self, rule, kind, f"the first {kind!r} layer (operation {kind!r})")
        bad = [p for p in self.names if not isinstance(p, str) or not p]
        if bad:
            raise RuleSetError(
                f"composite {self.name!r}: a name pattern is a non-empty string (fnmatch: "
                f"'blocks.*.mlp.fc1', 'head'), got {bad}"
            )

    def rule(
        self, kind: str, module: Optional[nn.Module] = None, name: Optional[str] = None, first: bool = False
    ) -> Rule:
        """The rule of one operation: ``kind``, its qualified module ``name`` in the model (if known) and whether
        it is the ``first`` module of its kind in input order. (``module`` is accepted for the callers' sake.)"""
        if name is not None:
            self._asked.setdefault(name, kind)
            for pattern, rule in self.names.items():
                if (rule.kinds is None or kind in rule.kinds) and fnmatchcase(name, pattern):
                    self._chosen.add(("names", pattern))
                    return rule
        if first and kind in self.first:
            self._chosen.add(("first", kind))
            return self.first[kind]
        try:
            return self.rules[kind]
        except KeyError:
            raise UnknownNameError(
                f"composite {self.name!r} has no rule for operation {kind!r}; it covers {', '.join(self.rules)}"
            ) from None

    def with_rules(
        self,
        name: Optional[str] = None,
        *,
        by_kind: Optional[Mapping[str, Rule]] = None,
        by_name: Optional[Mapping[str, Rule]] = None,
        first: Optional[Mapping[str, Rule]] = None,
    ) -> "Composite":
        """A copy with some rules replaced or added: ``by_kind`` replaces the rules of those operation kinds,
        ``by_name`` patterns are tried before the copied ones, ``first`` entries replace those of the same kind.

        ``name`` names the new rule set (default: this one's name and the changes, e.g.
        ``"attnlrp[linear: GammaGradient(0.25)]"``). A rule for the other kind of pass than this composite's, or
        for an operation it cannot serve: :class:`RuleSetError`, here.

        Example: ``ATTNLRP.with_rules(by_name={"blocks.*.mlp.*": GammaGradient(0.25)})`` — AttnLRP with the
        γ-rule on every MLP Linear.
        """
        by_kind, by_name, first = dict(by_kind or {}), dict(by_name or {}), dict(first or {})
        for where, entries in (("by_kind", by_kind), ("by_name", by_name), ("first", first)):
            for key, rule in entries.items():
                _check_pass_of(self, rule, f"{where}[{key!r}]")
        if name is None:
            parts = (
                [f"{k}: {r!r}" for k, r in by_kind.items()]
                + [f"{p}: {r!r}" for p, r in by_name.items()]
                + [f"first {k}: {r!r}" for k, r in first.items()]
            )
            name = f"{self.name}[{'; '.join(parts)}]" if parts else self.name
        return Composite(
            name=name,
            rules={**self.rules, **by_kind},
            names={**by_name, **{p: r for p, r in self.names.items() if p not in by_name}},
            first={**self.first, **first},
        )

    def fresh(self) -> "Composite":
        """The same rule set with an empty record of what chose a rule (:meth:`unused`): one per call."""
        return Composite(name=self.name, rules=dict(self.rules), names=dict(self.names), first=dict(self.first))

    def unused(self) -> list[str]:
        """The ``names`` patterns and ``first`` entries that chose the rule of no operation so far, each described
        with the layers the passes did ask a rule for (empty: every entry took effect)."""
        out = []
        for pattern, rule in self.names.items():
            if ("names", pattern) not in self._chosen:
                layers = [n for n, k in self._asked.items() if rule.kinds is None or k in rule.kinds]
                hits = [n for n in layers if fnmatchcase(n, pattern)]
                if hits:  # it matches, but an earlier pattern chose those layers' rule
                    out.append(
                        f"name pattern {pattern!r} ({rule!r}): it matches {', '.join(hits[:3])}, but an "
                        "earlier pattern chose their rule first (patterns are tried in order; with_rules puts "
                        "the new ones first)"
                    )
                    continue
                reach = "" if rule.kinds is None else f" of kind {'/'.join(rule.kinds)}"
                shown = ", ".join(layers[:6]) + (f", … ({len(layers)} in all)" if len(layers) > 6 else "")
                out.append(
                    f"name pattern {pattern!r} ({rule!r}) matched no layer{reach} the pass asked a rule "
                    f"for; those are named {shown or '(none)'}"
                )
        for kind, rule in self.first.items():
            if ("first", kind) not in self._chosen:
                out.append(f"first-layer entry {kind!r} ({rule!r}): the pass met no {kind!r} layer")
        return out

    def check_used(self, where: str) -> None:
        """Refuse (:class:`RuleSetError`) a rule set whose ``names`` / ``first`` entries changed nothing in the
        passes run: a pattern that names no layer, or layers of a kind its rule cannot serve, or layers
        ``where`` does not reach — the result would silently be the unmodified rule set's."""
        unused = self.unused()
        if unused:
            raise RuleSetError(
                f"{where}: composite {self.name!r} chose no rule with "
                + "; and ".join(unused)
                + ". Fix the pattern (fnmatch on the model's module names) or drop the entry"
            )


def _check_kind(c: Composite, rule: Rule, kind: str, where: str) -> None:
    """Refuse ``rule`` for operation ``kind`` unless it serves that kind (``Rule.kinds``)."""
    if rule.kinds is not None and kind not in rule.kinds:
        raise RuleSetError(
            f"composite {c.name!r}: {rule!r} cannot serve {where}: it serves "
            f"{', '.join(rule.kinds)}; for {kind!r} {_WORDS[c.serves]} accepts "
            f"{_accepted(kind, c.serves)}"
        )


def _accepted(kind: str, serves: str) -> str:
    """The library's rules of pass ``serves`` that serve operation ``kind``, named for messages."""
    base = ExplicitRule if serves == EXPLICIT else GradientRule
    found, todo = [], list(base.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("lrp_core.rules.") and (cls.kinds is None or kind in cls.kinds):
            found.append(cls.__name__)
    return ", ".join(sorted(set(found))) or "no rule of the library"


_A = {"ExplicitRule": "an ExplicitRule", "GradientRule": "a GradientRule"}

#: a rule's counterpart for the other kind of pass, for the messages
_COUNTERPART = {
    "GammaLinear": "GammaGradient",
    "EpsilonLinear": "EpsilonGradient",
    "GammaGradient": "GammaLinear",
    "EpsilonGradient": "EpsilonLinear",
    "SignedLinear": "Gradient",
    "BaselineLinear": "Gradient",
}


def _check_pass_of(c: Composite, rule: Rule, where: str) -> None:
    """Refuse ``rule`` at ``where`` of a rule set derived from ``c`` unless it serves ``c``'s kind of pass."""
    got = getattr(rule, "serves", "")
    if got == c.serves or got not in PASS_KINDS:  # a rule of neither kind: the new composite names it
        return
    contract = "ExplicitRule" if c.serves == EXPLICIT else "GradientRule"
    instead = _COUNTERPART.get(type(rule).__name__)
    hint = f" — here {instead}" if instead else ""
    raise RuleSetError(
        f"composite {c.name!r} serves {_WORDS[c.serves]}, but {where} is {rule!r}, a rule of "
        f"{_WORDS[got]}; {where} accepts a rule of {_WORDS[c.serves]} ({_A[contract]}){hint}"
    )


def _pass_served(c: Composite) -> str:
    """The one kind of pass all of ``c``'s rules serve (that of its rules by kind, where it has any)."""
    every = [*c.rules.values(), *c.names.values(), *c.first.values()]
    if not every:
        raise RuleSetError(f"composite {c.name!r} has no rules")
    for rule in every:
        if getattr(rule, "serves", "") not in PASS_KINDS:
            raise RuleSetError(
                f"composite {c.name!r}: {rule!r} serves no kind of pass; derive a rule from "
                "ExplicitRule (relevance(op, R), explicit passes) or GradientRule "
                "(forward(fn, *inputs), modified-gradient replays)"
            )
    seen: dict[str, Rule] = {}
    for rule in c.rules.values() or every:
        seen.setdefault(rule.serves, rule)
    if len(seen) > 1:
        raise RuleSetError(
            f"composite {c.name!r} mixes explicit-pass rules (e.g. {seen[EXPLICIT]!r}) with "
            f"modified-gradient rules (e.g. {seen[MODIFIED_GRADIENT]!r}); a composite serves one "
            "kind of pass: make one composite of each"
        )
    serves = next(iter(seen))
    for where, entries in (("names", c.names), ("first", c.first)):
        for key, rule in entries.items():
            if rule.serves != serves:
                contract = "ExplicitRule" if serves == EXPLICIT else "GradientRule"
                instead = _COUNTERPART.get(type(rule).__name__)
                hint = f" — here {instead}" if instead else ""
                raise RuleSetError(
                    f"composite {c.name!r} serves {_WORDS[serves]} (its rules by operation kind), "
                    f"but {where}[{key!r}] is {rule!r}, a rule of {_WORDS[rule.serves]}; it accepts "
                    f"a rule of {_WORDS[serves]} ({_A[contract]}){hint}"
                )
    return serves


#: what to use instead, per kind of pass, for the messages of :func:`check_pass`
_INSTEAD = {
    EXPLICIT: "run it as an explicit relevance pass — adapter.forward(prepared, composite=composite), then "
    "adapter.relprop(trace, R, composite) (as the methods transformer_attribution, lrp and partial_lrp do)",
    MODIFIED_GRADIENT: "run it as a modified-gradient replay — Replay(composite), adapter.forward(prepared, "
    "grad=True, composite=composite), then gradient × input (as the methods attnlrp and cp_lrp do)",
}


_SETS = {EXPLICIT: "TRANSFORMER_ATTRIBUTION, LRP_BASELINE", MODIFIED_GRADIENT: "ATTNLRP, CP_LRP"}


_WORDS = {EXPLICIT: "an explicit relevance pass", MODIFIED_GRADIENT: "a modified-gradient replay"}


def check_pass(composite: Composite, serves: str, where: str) -> None:
    """Refuse at once a composite that does not serve the pass ``where`` runs (:class:`RuleSetError`).

    Parameters
    ----------
    composite : Composite
        The rule set to check.
    serves : str
        The pass the caller runs: ``EXPLICIT`` or ``MODIFIED_GRADIENT``.
    where : str
        Name of the caller, for the message.

    Raises
    ------
    RuleSetError
        If ``composite`` is not a :class:`Composite`, or it is a rule set for the
        other pass (the message says which rule sets fit).
    """
    if not isinstance(composite, Composite):
        raise RuleSetError(
            f"{where} runs {_WORDS[serves]} and takes a Composite (e.g. {_SETS[serves]}), "
            f"got {type(composite).__name__}"
        )
    got = composite.serves
    if got == serves:
        return
    raise RuleSetError(
        f"{where} runs {_WORDS[serves]}, but composite {composite.name!r} is a rule set for "
        f"{_WORDS[got]}: {_INSTEAD[got]}; or pass a rule set for {_WORDS[serves]} "
        f"(e.g. {_SETS[serves]}) to {where}"
    )


class RuleChoice:
    """What both kinds of pass share: a composite checked to serve the pass, and where each module sits.

    Args:
        composite: the rule set; refused at once unless it serves ``serves`` (the subclass's kind of pass).
        names: the model's module → qualified name (``Adapter.module_names``); needed when the composite
            has a ``names`` map.
        first: operation kind → the first module of that kind in input order (``Trace.first``, recorded by
            the replay); needed when the composite has a ``first`` map.
    """

    serves = ""
    composite: Optional[Composite]  # None only in a plain Replay, which asks for no rule

    def __init__(
        self,
        composite: Composite,
        names: Optional[Mapping[nn.Module, str]] = None,
        first: Optional[Mapping[str, nn.Module]] = None,
    ):
        where = type(self).__name__
        check_pass(composite, self.serves, where)
        if composite.names and names is None:
            raise RuleSetError(
                f"composite {composite.name!r} chooses rules by module name: {where} needs the "
                "model's module names (names=adapter.module_names)"
            )
        if composite.first and first is None:
            raise RuleSetError(
                f"composite {composite.name!r} chooses rules for the first layer of a kind: "
                f"{where} needs the replay's order (first=trace.first)"
            )
        self.composite = composite
        self._names = names if composite.names else None  # looked up only where the composite reads names
        self._first = first if composite.first else None

    def rule(self, kind: str, module: Optional[nn.Module] = None) -> Rule:
        """The composite's rule for one operation, told the module's name and place where it reads them."""
        assert self.composite is not None, "a rule is asked of a rule set (a plain Replay has none and asks none)"
        if module is None or (self._names is None and self._first is None):
            return self.composite.rule(kind, module)
        name = None if self._names is None else self._names.get(module)
        first = self._first is not None and self._first.get(kind) is module
        return self.composite.rule(kind, module, name, first)


# ----------------------------------------------------------------------------
# the rule sets
# ----------------------------------------------------------------------------
def _identities() -> dict[str, Rule]:
    """Operations that pass relevance unchanged in the explicit passes (docs/METHODS.md §1.2, §2c)."""
    return {LAYERNORM: Identity(), RMSNORM: Identity(), ELEMENTWISE: Identity(), SCALE: Identity(), SOFTMAX: Identity()}


#: The rules of Chefer et al. (CVPR 2021), used by ``transformer_attribution``; decoders' operations per §2c.
TRANSFORMER_ATTRIBUTION = Composite(
    name="transformer_attribution",
    rules={
        LINEAR: SignedLinear(),
        PATCH_CONV: ZBox(),
        **_identities(),
        ADD: NormalizedAdd(),
        MASK_ADD: NormalizedAdd(),
        POS_ADD: GenericAdd(),
        MATMUL_QK: HalvedMatMul(),
        MATMUL_AV: HalvedMatMul(),
        CLONE: Clone(),
        READOUT: Select(),
        POOL: WeightedSum(),
        ROPE: Rotary(),
        KV_REPEAT: SharedHeads(),
        GATE_MUL: HalvedProduct(),
        ATTENTION: NoExplicitFusedAttention(),
        ROUTE: Routing(),
        EXPERT_SUM: NormalizedSum(),
    },
)

#: The LRP baseline (``lrp``, ``partial_lrp``): no Add normalisation, separate denominators.
# (the ignores below: mypy cannot tell that the spread kinds are not the keywords ``names`` / ``first``)
LRP_BASELINE = TRANSFORMER_ATTRIBUTION.with_rules(
    "lrp_baseline",
    by_kind={LINEAR: BaselineLinear(), ADD: GenericAdd(), MASK_ADD: GenericAdd(), EXPERT_SUM: GenericSum()},
)


def _gradient_everywhere() -> dict[str, Rule]:
    return {kind: Gradient() for kind in OP_KINDS}


#: AttnLRP (Achtibat et al., ICML 2024) as LXT's efficient mode: ``attnlrp`` (decoders: LXT git HEAD, §2c).
ATTNLRP = Composite(
    name="attnlrp",
    rules={
        **_gradient_everywhere(),
        LAYERNORM: DetachedStdLayerNorm(),
        RMSNORM: DetachedRMSNorm(),
        ELEMENTWISE: IdentityRule(),
        MATMUL_QK: HalvedGradient(),
        MATMUL_AV: HalvedGradient(),
        GATE_MUL: HalvedGradient(),
        ATTENTION: FusedAttentionLRP(),
    },
)

#: CP-LRP (Ali et al., ICML 2022): AttnLRP's rules, but Q and K detached, the gate detached, no halving: ``cp_lrp``.
#: Mixture-of-experts: the routing weights detached too (ROUTE), so a routed product is linear in its expert (§2c.4).
CP_LRP = ATTNLRP.with_rules(
    "cp_lrp",
    by_kind={
        MATMUL_QK: DetachedOperands(),
        MATMUL_AV: Gradient(),
        GATE_MUL: DetachedGate(),
        ATTENTION: FusedAttentionCP(),
        ROUTE: DetachedOperands(),
    },
)

#: The PA-LRP authors' ViT rule set (their ``cp_rule``): CP-LRP, but ``A·V`` keeps AttnLRP's uniform rule, so v
#: gets half of its relevance and the attention weights' half is dropped (not conservative; §2e.4).
CP_HALVED = CP_LRP.with_rules("cp_halved", by_kind={MATMUL_AV: HalvedGradient(), ATTENTION: FusedAttentionCPHalved()})

#: the rule sets PA-LRP builds on (``pa_lrp``'s option ``base``)
PA_LRP_BASES = {"attnlrp": ATTNLRP, "cp_lrp": CP_LRP, "cp_halved": CP_HALVED}


def pa_lrp_composite(base: str = "attnlrp") -> tuple[Composite, PositionLeaves]:
    """PA-LRP (Bakish et al., 2025) on ``base``: the rule set with position encodings as relevance inputs.

    ``base`` is AttnLRP, CP-LRP, or the authors' ViT rules "cp_halved"; the composite has
    ``base``'s rules, with the rotary tables (ROPE) and the added position embeddings (POS_ADD) made inputs that
    take relevance (docs/METHODS.md §2e).

    Returns the composite and the :class:`PositionLeaves` its rules fill during one replay (a fresh pair per call:
    the leaves belong to one pass).

    Parameters
    ----------
    base : str, optional
        The rule set PA-LRP builds on, a key of ``PA_LRP_BASES``: ``"attnlrp"``,
        ``"cp_lrp"`` or ``"cp_halved"``.

    Returns
    -------
    tuple[Composite, PositionLeaves]
        The composite and its :class:`PositionLeaves`.
    """
    positions = PositionLeaves()
    composite = PA_LRP_BASES[base].with_rules(
        f"pa_lrp[{base}]", by_kind={ROPE: PositionalRotary(positions), POS_ADD: PositionalAdd(positions)}
    )
    return composite, positions


__all__ = [
    "PA_LRP_BASES",
    "pa_lrp_composite",
    "Composite",
    "check_pass",
    "RuleChoice",
    "TRANSFORMER_ATTRIBUTION",
    "LRP_BASELINE",
    "ATTNLRP",
    "CP_LRP",
    "CP_HALVED",
]
