"""A resources server where every N-th tool call (or /verify) never answers: a straggler for the trainer.

The tool is ``add_to_cart``, the call :class:`~tests.train.shopper.Shopper` makes, so a scripted policy
reaches it; a random tiny model makes no tool call, so ``hang_in: verify`` puts the hang where every
rollout goes. The hang is an await that never ends (as a proxy that drops the request, or a verifier
stuck on one input): the server keeps answering everything else. Calls are counted per server, so which
rollouts hang depends on arrival order, but how many do per batch does not.

Run it as its own process (real HTTP): ``python -m tests.train.straggler_env --hang-every 8 --hang-in tool``
prints ``straggler resources server listening on URL``; or name it as ``env.<name>.server`` with
``env.<name>.config: {hang_every: 8}`` (Ray env replicas start it that way).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Literal

from pydantic import BaseModel

from gym_bridge.records.schema import VerifyRequest, VerifyResponse, assistant_text, dump
from gym_bridge.serving.server import ResourcesServer, ServerSettings, Session, tool


class StragglerConfig(BaseModel):
    hang_every: int = 0
    """Every this many calls of ``hang_in`` never answers (0: none does)..."""
    hang_after: int = 0
    """...once this many have been answered (so a run's first steps show its normal pace)."""
    hang_in: Literal["tool", "verify"] = "tool"
    delay_s: float = 0.0
    """Every answered tool call and /verify takes this long (a healthy environment's latency)."""


class CartArgs(BaseModel):
    product_id: str
    quantity: int


class StragglerEnv(ResourcesServer):
    """Reward 1 for a rollout whose tool call was answered, else the parity of the answer's length."""

    name = "straggler"

    def __init__(self, settings: ServerSettings | None = None, config: StragglerConfig | None = None) -> None:
        super().__init__(settings)
        self.config = config or StragglerConfig()
        self.calls = 0
        self.hung = 0

    async def _maybe_hang(self, where: str) -> None:
        config = self.config
        if where == config.hang_in and config.hang_every:
            self.calls += 1
            beyond = self.calls - config.hang_after
            if beyond > 0 and beyond % config.hang_every == 0:
                self.hung += 1
                await asyncio.Event().wait()  # never set: this request is never answered
        if config.delay_s:
            await asyncio.sleep(config.delay_s)

    @tool
    async def add_to_cart(self, args: CartArgs, session: Session) -> dict[str, Any]:
        """Put units of a product in the cart."""
        await self._maybe_hang("tool")
        session.state["added"] = args.quantity
        return {"added": args.quantity, "product_id": args.product_id}

    async def verify(self, body: VerifyRequest, session: Session) -> VerifyResponse:
        await self._maybe_hang("verify")
        if "added" in session.state:
            return VerifyResponse(**dump(body), reward=1.0)
        return VerifyResponse(**dump(body), reward=float(len(assistant_text(body.response.output)) % 2 == 0))

    def health(self) -> dict[str, Any]:
        return {**super().health(), "calls": self.calls, "hung": self.hung}


STRAGGLER_SERVER = f"{__name__}:StragglerEnv"
"""``env.<name>.server`` value that starts :class:`StragglerEnv` (in a Ray env replica too)."""


def main(argv: list[str] | None = None) -> None:
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hang-every", type=int, default=0)
    parser.add_argument("--hang-after", type=int, default=0)
    parser.add_argument("--hang-in", choices=["tool", "verify"], default="tool")
    parser.add_argument("--delay-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    config = StragglerConfig(
        hang_every=args.hang_every, hang_after=args.hang_after, hang_in=args.hang_in, delay_s=args.delay_s
    )
    server = StragglerEnv(config=config)
    running = start_in_thread(server.build_app())
    print(f"straggler resources server listening on {running.url}", flush=True)
    running._thread.join()


if __name__ == "__main__":
    main()
