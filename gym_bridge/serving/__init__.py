"""Serving, on the substrate floor: the HTTP layer every server and every call to a server goes through.

Owns the route table and its ASGI app (``json_http``), the resources-server base a new environment
subclasses (``server``: ``ResourcesServer``, ``tool``), its cookie sessions (``cookie_sessions``), NeMo
Gym's typed sessions (``resources_sessions``), tools over MCP (``mcp_tools``), what a server refuses before
reading a body (``request_guard``, ``header_limits``, ``body_budget``, ``deadlines``), uvicorn in a
thread (``uvicorn_thread``), the event loop (``event_loop``), servers called without a socket
(``in_process``), the retries of a rollout's HTTP calls (``retry``), the bearer-token header its
clients send (``auth``) and a verifier pool's view of one worker process (``pipe_worker``).

May import: :mod:`gym_bridge.records` and its own floor (the consoles, ``sandbox/``, ``distributed/``);
never models, generation, the agent or anything above.
"""
