"""A tiny multi-reward environment (NeMo Gym's ``reward_components`` shape) for collect and train tests.

``/verify`` scores three independent objectives and sets ``reward`` to their sum, as NeMo Gym's
multi-reward example does:

* ``correct``: the last ``\\boxed{}`` equals the row's ``expected_answer``;
* ``format``: the answer has a ``\\boxed{}`` at all;
* ``even_length``: the answer has an even number of characters (a signal a random model hits half
  the time, so a training run on a random tiny model has something to normalise).

A row with ``"bad_components": true`` gets a component that is not a number, to test that a client
refuses it.
"""

from __future__ import annotations

import re

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.serving.server import ResourcesServer, Session

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class MultiRewardEnv(ResourcesServer):
    """Three reward components per rollout and their sum as ``reward``."""

    name = "multi_reward"
    reverify_mode = "stateless"

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        text = assistant_text(body.response.output)
        found = _BOXED.findall(text)
        components = {
            "correct": float(bool(found) and found[-1].strip() == str(getattr(body, "expected_answer", ""))),
            "format": float(bool(found)),
            "even_length": float(len(text) % 2 == 0),
        }
        if getattr(body, "bad_components", False):  # bypasses the schema's check, as a buggy server might
            return VerifyResponse.model_construct(
                **dump(body), reward=1.0, reward_components={"correct": "high"}
            )
        return VerifyResponse(**dump(body), reward=sum(components.values()), reward_components=components)


MULTI_REWARD_SERVER = f"{__name__}:MultiRewardEnv"
"""``env.<name>.server`` value that starts :class:`MultiRewardEnv` in the trainer."""
