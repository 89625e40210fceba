"""Named variants of the algorithm: advantage estimators and policy-loss surrogates, one function each.

A config names a variant (``grpo.adv_estimator.name``, ``loss_fn.policy_loss``); the trainer looks the
name up here. Adding a variant is one decorated function, in the style of verl's ``register_adv_est`` /
``register_policy_loss``::

    from gym_bridge.train.registry import register_adv_estimator

    @register_adv_estimator("sign")
    def sign_advantages(batch, grpo):
        "A_i = sign(r_i - mean of the group's rewards)."
        return torch.sign(compute_advantages(batch.rewards, batch.prompt_ids, normalize_rewards=False))

The function's module must be imported before the config is loaded (in the process that trains).

This module imports neither torch nor the config, so the config can check a name at load time; the
built-in variants register themselves when their modules (``PROVIDERS``) are imported, which a
lookup does on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "ADV_ESTIMATORS",
    "POLICY_LOSSES",
    "Registry",
    "Variant",
    "register_adv_estimator",
    "register_policy_loss",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Variant:
    """A registered function and what the rest of the trainer must know about it."""

    name: str
    fn: Callable[..., Any]
    traits: dict[str, Any] = field(default_factory=dict)
    """Declared at registration; every registry's ``defaults`` says which traits its variants have."""


class Registry:
    """Name -> :class:`Variant` for one config key, refusing unknown names with the registered ones."""

    def __init__(self, key: str, what: str, providers: tuple[str, ...], defaults: dict[str, Any]):
        self.key = key
        """The config key that names a variant, for messages."""
        self.what = what
        self.providers = providers
        """Modules whose import registers the built-in variants."""
        self.defaults = defaults
        """Every trait a variant of this registry has, with its value when registration leaves it out."""
        self._variants: dict[str, Variant] = {}
        self._loaded = False

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        """Decorator: register the function under ``name`` (a name already taken is refused)."""
        unknown = sorted(set(traits) - set(self.defaults))
        if unknown:
            raise TypeError(f"{self.what} {name!r}: unknown traits {unknown}; known: {sorted(self.defaults)}")

        def decorator(fn: F) -> F:
            taken = self._variants.get(name)
            if taken is not None and taken.fn is not fn:
                raise ValueError(f"{self.key} {name!r} is registered already (by {taken.fn.__qualname__})")
            self._variants[name] = Variant(name, fn, {**self.defaults, **traits})
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Forget ``name`` (for tests that register a variant of their own)."""
        self._variants.pop(name, None)

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self.providers:
                importlib.import_module(module)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self._load()
        return sorted(self._variants)

    def get(self, name: str) -> Variant:
        """The variant registered as ``name``; a :class:`ValueError` naming the key and the choices if none."""
        self._load()
        if name not in self._variants:
            raise ValueError(self.refusal(name))
        return self._variants[name]

    def refusal(self, name: str) -> str:
        """The message for an unknown ``name`` (it starts with "expects", the loader's form)."""
        choices = ", ".join(repr(n) for n in self.names())
        return f"expects a registered {self.what} ({choices}), got {name!r}"

    def having(self, test: Callable[[dict[str, Any]], bool]) -> list[str]:
        """Names of the variants whose traits pass ``test``, sorted."""
        self._load()
        return sorted(n for n, v in self._variants.items() if test(v.traits))


ADV_ESTIMATORS = Registry(
    "grpo.adv_estimator.name",
    "advantage estimator",
    providers=("gym_bridge.train.advantages",),
    defaults={"components": False, "reads": ()},
)
"""Advantage estimators: ``fn(batch: AdvantageInputs, grpo: GRPOConfig) -> (b,) advantages``
(:mod:`gym_bridge.train.advantages`). Traits: ``components`` (it takes the (b, k) reward components,
GDPO, instead of one reward per sample), ``reads`` (the ``grpo.adv_estimator`` keys besides ``name``
it reads, e.g. ``minus_baseline``; the config refuses them set for an estimator that does not)."""

POLICY_LOSSES = Registry(
    "loss_fn.policy_loss",
    "policy loss",
    providers=("gym_bridge.train.policy_losses",),
    defaults={"sequence_level": False, "dual_clip": True},
)
"""Policy-loss surrogates: ``fn(terms: SurrogateTerms) -> (b, t) per-token actor loss``
(:mod:`gym_bridge.train.policy_losses`). Traits: ``sequence_level`` (the ratios, and the off-policy
correction, are one per sequence: GSPO), ``dual_clip`` (whether ``loss_fn.ratio_clip_c`` applies to it;
the config refuses it set otherwise)."""

register_adv_estimator = ADV_ESTIMATORS.register
register_policy_loss = POLICY_LOSSES.register
