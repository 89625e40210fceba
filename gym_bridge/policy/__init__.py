"""The embedded policy server: OpenAI-compatible endpoints over a generation backend.

:class:`~gym_bridge.policy.service.PolicyService` answers the requests (no HTTP; request bodies in
:mod:`~gym_bridge.policy.api`, streamed answers in :mod:`~gym_bridge.policy.streaming`);
:func:`gym_bridge.policy.server.build_policy_app` serves it. Neither imports torch.

Policy floor: imports the generation backends' interface, the record formats and the HTTP substrate
(:mod:`gym_bridge.serving.json_http`); the runs (collect's ``--policy``, the trainer) and ``serve`` import it.
"""
