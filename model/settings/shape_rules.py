"""What each field of a GPT-2 model shape allows, as data: GPTConfig (model.gpt.model) enforces these
rules and the trainer's config (model.settings.config) checks its model.* keys against them.

Torch-free, so the launcher validates a run's config on the operator's machine before any node
is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ShapeRule:
    """What one field of a model shape allows: a bound on its own value and, for some, a relation to
    another field. GPTConfig enforces the rules; the trainer's config (model.settings.config) checks its
    model.* keys against the same rules, so each constraint is written once."""

    field: str
    bound: Callable[[Any], bool]
    """True when the field's value is within its own bound."""
    bound_text: str
    """The bound in words, e.g. ">= 1"."""
    relation: Callable[[Any], bool] | None = None
    """True when the field agrees with the others (given the whole shape); None: no relation."""
    relation_text: str = ""
    """The relation in words; {prefix} stands before other fields' names, {n_head} etc. for their values."""

    def holds(self, shape: Any) -> bool:
        return self.bound(getattr(shape, self.field)) and (self.relation is None or self.relation(shape))

    def relation_allows(self, shape: Any, prefix: str = "") -> str:
        return self.relation_text.format(prefix=prefix, **vars(shape))

    def allowed(self, shape: Any, prefix: str = "") -> str:
        """The whole allowed range in words, e.g. ">= 1 and divisible by model.n_head (6)"."""
        if self.relation is None:
            return self.bound_text
        return f"{self.bound_text} and {self.relation_allows(shape, prefix)}"


def _at_least_one(value: int) -> bool:
    return value >= 1


SHAPE_RULES = (
    ShapeRule("block_size", _at_least_one, ">= 1"),
    ShapeRule("vocab_size", _at_least_one, ">= 1"),
    ShapeRule("n_layer", _at_least_one, ">= 1"),
    ShapeRule("n_head", _at_least_one, ">= 1"),
    # Every head gets n_embd / n_head channels.
    ShapeRule(
        "n_embd",
        _at_least_one,
        ">= 1",
        lambda shape: shape.n_embd % max(shape.n_head, 1) == 0,
        "divisible by {prefix}n_head ({n_head})",
    ),
    ShapeRule("dropout", lambda p: 0.0 <= p < 1.0, "in [0, 1)"),
)


# OpenAI's released sizes; anything else is a custom GPTConfig. Here, torch-free, so the launcher's
# memory estimate (model.gpt.memory_estimate) reads them too.
PRESETS: dict[str, dict[str, int]] = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}
