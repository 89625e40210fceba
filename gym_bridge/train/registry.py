"""Named variants of the algorithm: advantage estimators and policy-loss surrogates, one function each.

A config names a variant (``grpo.adv_estimator.name``, ``loss_fn.policy_loss``); the trainer looks the
name up here. Adding a variant is one decorated function, in the style of verl's ``register_adv_est`` /
``register_policy_loss``::

    from gym_bridge.train.registry import register_adv_estimator

    @register_adv_estimator("sign")
    def sign_advantages(batch, grpo):
        "A_i = sign(r_i - mean of the group's rewards)."
        return torch.sign(compute_advantages(batch.rewards, batch.prompt_ids, normalize_rewards=False))

Its module must be imported before the config is loaded, in the process that trains.

The built-in variants are listed at the bottom of this module by name, traits and ``module:function``,
resolved on first call: this module imports neither torch nor the config, so the config checks a
name and its traits at load time without loading anything heavy.
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
    target: Callable[..., Any] | str
    """The function, or ``"module:function"`` for a built-in, imported on first use."""
    traits: dict[str, Any] = field(default_factory=dict)
    """Declared at registration; every registry's ``defaults`` says which traits its variants have."""

    @property
    def fn(self) -> Callable[..., Any]:
        """The function itself."""
        if callable(self.target):
            return self.target
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


class Registry:
    """Name -> :class:`Variant` for one config key, refusing unknown names with the registered ones."""

    def __init__(self, key: str, what: str, defaults: dict[str, Any]):
        self.key = key
        """The config key that names a variant, for messages."""
        self.what = what
        self.defaults = defaults
        """Every trait a variant of this registry has, with its value when registration leaves it out."""
        self._variants: dict[str, Variant] = {}

    def add(self, name: str, target: Callable[..., Any] | str, **traits: Any) -> None:
        """Register ``target`` (a function or ``"module:function"``) as ``name``; a name taken is refused."""
        traits = self._traits(name, traits)
        taken = self._variants.get(name)
        if taken is not None and taken.target is not target:
            raise ValueError(f"{self.key} {name!r} is registered already")
        self._variants[name] = Variant(name, target, traits)

    def register(self, name: str, **traits: Any) -> Callable[[F], F]:
        """Decorator: register the function as ``name`` with ``traits`` (see :meth:`add`)."""
        self._traits(name, traits)  # an unknown trait fails here, before a function is given

        def decorator(fn: F) -> F:
            self.add(name, fn, **traits)
            return fn

        return decorator

    def _traits(self, name: str, traits: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(traits) - set(self.defaults))
        if unknown:
            raise TypeError(f"{self.what} {name!r}: unknown traits {unknown}; known: {sorted(self.defaults)}")
        return {**self.defaults, **traits}

    def unregister(self, name: str) -> None:
        """Forget ``name`` (for tests that register a variant of their own)."""
        self._variants.pop(name, None)

    def get(self, name: str) -> Variant:
        """The variant registered as ``name``; a :class:`ValueError` naming the choices if none."""
        if name not in self._variants:
            raise ValueError(self.refusal(name))
        return self._variants[name]

    def refusal(self, name: str) -> str:
        """The message for an unknown ``name`` (it starts with "expects", the config loader's form)."""
        choices = ", ".join(repr(n) for n in sorted(self._variants))
        return f"expects a registered {self.what} ({choices}), got {name!r}"

    def having(self, test: Callable[[dict[str, Any]], bool]) -> list[str]:
        """Names of the variants whose traits pass ``test``, sorted."""
        return sorted(n for n, v in self._variants.items() if test(v.traits))


ADV_ESTIMATORS = Registry("grpo.adv_estimator.name", "advantage estimator", {"components": False, "reads": ()})
"""Advantage estimators: ``fn(batch: AdvantageInputs, grpo: GRPOConfig) -> (b,) advantages``
(:mod:`gym_bridge.train.algorithm.advantages`). Traits: ``components`` (it takes the (b, k) reward components,
GDPO, instead of one reward per sample), ``reads`` (the ``grpo.adv_estimator`` keys besides ``name``
it reads; the config refuses them set for an estimator that does not)."""

POLICY_LOSSES = Registry("loss_fn.policy_loss", "policy loss", {"sequence_level": False, "dual_clip": True})
"""Policy-loss surrogates: ``fn(terms: SurrogateTerms) -> (b, t) per-token actor loss``
(:mod:`gym_bridge.train.algorithm.policy_losses`). Traits: ``sequence_level`` (the ratios, and the off-policy
correction, are one per sequence: GSPO), ``dual_clip`` (whether ``loss_fn.ratio_clip_c`` applies to it;
the config refuses it set otherwise)."""

register_adv_estimator = ADV_ESTIMATORS.register
register_policy_loss = POLICY_LOSSES.register

# The built-in variants (NeMo RL's names).
ADV_ESTIMATORS.add("grpo", "gym_bridge.train.algorithm.advantages:grpo_estimator")
ADV_ESTIMATORS.add(
    "reinforce_plus_plus",
    "gym_bridge.train.algorithm.advantages:reinforce_plus_plus_estimator",
    reads=("minus_baseline",),
)
ADV_ESTIMATORS.add(
    "gdpo", "gym_bridge.train.algorithm.advantages:gdpo_estimator", components=True, reads=("reward_weights",)
)
POLICY_LOSSES.add("ppo", "gym_bridge.train.algorithm.policy_losses:ppo")
POLICY_LOSSES.add("gspo", "gym_bridge.train.algorithm.policy_losses:gspo", sequence_level=True)
POLICY_LOSSES.add("cispo", "gym_bridge.train.algorithm.policy_losses:cispo", dual_clip=False)
