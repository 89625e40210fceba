"""``gym-bridge serve``: run a resources server or the embedded policy server in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gym_bridge.commands.typer_app import App
from gym_bridge.rollout.envs import BUILTIN_SERVERS
from gym_bridge.serving.request_guard import ALLOWED_HOST_HELP, check_host_names

# Each built-in server has its own default port, so all of them and the policy server (8000) can run at
# once without --port; the resources servers' READMEs use the same numbers.
DEFAULT_PORTS: dict[str, int] = {"math": 8001, "code": 8002, "tool_use": 8003, "reasoning_gym": 8004, "equivalence_judge": 8005}
POLICY_PORT = 8000

app = App(help="Run a resources server (math, code, tool_use, reasoning_gym, equivalence_judge) or the embedded policy server.", no_args_is_help=True)


def _env_command(env_name: str) -> None:
    def run(
        host: Annotated[str, typer.Option(help="Interface to bind; loopback by default.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = DEFAULT_PORTS[env_name],
        token: Annotated[str | None, typer.Option(help="Require 'Authorization: Bearer TOKEN'.")] = None,
        config: Annotated[Path | None, typer.Option(help="The server's settings (YAML with its config.yaml's keys).")] = None,
        judge_url: Annotated[str | None, typer.Option(help="LLM judge: an OpenAI-compatible base URL, e.g. "
                             "http://127.0.0.1:8000/v1 (equivalence_judge; math: turns should_use_judge on).")] = None,
        judge_model: Annotated[str | None, typer.Option(help="LLM judge: the model name its requests carry.")] = None,
        allowed_host: Annotated[list[str] | None, typer.Option(metavar="NAME", help=ALLOWED_HOST_HELP)] = None,
        expose_tools_over_mcp: Annotated[bool, typer.Option(help="Also serve the tools over MCP at /mcp (NeMo Gym's "
                                        "expose_tools_over_mcp); each seed answer carries the session's token.")] = False,
    ) -> None:
        from gym_bridge.rollout.envs import load_server_class
        from gym_bridge.serving.server import ServerSettings
        from gym_bridge.serving.uvicorn_thread import start_in_thread

        server_class = load_server_class(env_name)
        try:
            check_host_names(allowed_host or [], "--allowed-host")
            settings = _server_config(server_class, config, judge_url=judge_url, judge_model=judge_model)
            kwargs = {"config": settings} if settings is not None else {}
            network = ServerSettings(host=host, port=port, auth_token=token, expose_tools_over_mcp=expose_tools_over_mcp,
                                     allowed_hosts=allowed_host or [])  # fmt: skip
            server = server_class(network, **kwargs)
            if getattr(server_class, "needs_judge", False) and not server.config.judge_url:
                raise ValueError("judge_url: this server needs an LLM judge; give --judge-url URL (an OpenAI-compatible "
                                 "base URL such as http://127.0.0.1:8000/v1) or judge_url in --config")  # fmt: skip
        except (ValueError, OSError) as err:
            typer.echo(f"error: {env_name}: {err}", err=True)
            raise typer.Exit(2) from None
        running = start_in_thread(server.build_app(), host=host, port=port)
        typer.echo(f"{env_name} resources server listening on {running.url} (docs: {running.url}/docs)")
        try:
            running._thread.join()
        except KeyboardInterrupt:
            running.stop()

    app.command(env_name, help=f"Run the '{env_name}' resources server.")(run)


def _server_config(server_class: type, path: Path | None, **judge: str | None) -> object | None:
    """The server's config from ``--config`` (else its own config.yaml) with the judge options over it;
    None when no option asks for one (the server loads its defaults). An option the server has no key
    for is refused naming the option."""
    if path is None and not any(judge.values()):
        return None
    import inspect
    import typing

    import yaml

    hint = typing.get_type_hints(server_class.__init__).get("config")
    config_class = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    if config_class is None:
        raise ValueError(f"--config: the {server_class.name} server takes no settings")
    source = path or Path(inspect.getfile(server_class)).with_name("config.yaml")
    data = (yaml.safe_load(source.read_text()) or {}) if source.exists() else {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    section = getattr(server_class, "name", None)
    if list(data) == [section] and section not in config_class.model_fields and isinstance(data[section], dict):
        data = data[section]  # the layout of the server's own config.yaml (its settings under its name)
    for key, value in judge.items():
        if value is None:
            continue
        if key not in config_class.model_fields:
            raise ValueError(f"--{key.replace('_', '-')}: the {server_class.name} server has no LLM judge")
        data[key] = value
        if key == "judge_url" and "should_use_judge" in config_class.model_fields:
            data["should_use_judge"] = True
    return config_class.model_validate(data)


for _name in BUILTIN_SERVERS:
    _env_command(_name)


@app.command("policy")
def policy(
    model: Annotated[
        str,
        typer.Option(
            help="Built-in model name (tiny, smollm2-135m), a local Hugging Face model directory, or a .gguf "
            "file (de-quantised to float32 on load)."
        ),
    ],
    host: Annotated[str, typer.Option(help="Interface to bind; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = POLICY_PORT,
    max_batch_size: Annotated[int, typer.Option(help="Most requests generated in one batch.")] = 64,
    batch_wait_ms: Annotated[float, typer.Option(help="How long a request waits for others to batch with.")] = 5.0,
    max_output_tokens: Annotated[int, typer.Option(help="Server cap on max_output_tokens / max_tokens.")] = 1024,
    return_token_ids: Annotated[
        bool, typer.Option(help="Attach prompt/generation token ids and log-probs to every response (for RL).")
    ] = False,
    backend: Annotated[str, typer.Option(help="Generation backend: transformers (CPU) or vllm (CUDA).")] = "transformers",
    seed: Annotated[int, typer.Option(help="Seed for requests that do not bring their own.")] = 0,
    token: Annotated[
        str | None,
        typer.Option(
            help="Require 'Authorization: Bearer TOKEN' on every route but /health "
            "(clients: collect --api-key, OPENAI_API_KEY, openai.OpenAI(api_key=...))."
        ),
    ] = None,
    allowed_host: Annotated[list[str] | None, typer.Option(metavar="NAME", help=ALLOWED_HOST_HELP)] = None,
) -> None:
    """Run the embedded OpenAI-compatible policy server (/v1/responses, /v1/chat/completions)."""
    from gym_bridge.generation import load_backend
    from gym_bridge.policy.server import build_policy_app
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    kwargs = {"seed": seed} if backend == "transformers" else {}
    try:
        check_host_names(allowed_host or [], "--allowed-host")
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        generation_backend = load_backend(model, kind=backend, **kwargs)  # type: ignore[arg-type]
    except (ValueError, OSError, ImportError) as err:
        typer.echo(f"error: model {model}: {err}", err=True)
        raise typer.Exit(2) from None
    app_ = build_policy_app(
        generation_backend,
        model_name=model,
        max_batch_size=max_batch_size,
        batch_wait_ms=batch_wait_ms,
        max_output_tokens=max_output_tokens,
        return_token_ids=return_token_ids,
        auth_token=token,
        allowed_hosts=[host, *(allowed_host or [])],
    )
    running = start_in_thread(app_, host=host, port=port, timeout=120.0)
    typer.echo(f"policy server for {model} listening on {running.url}/v1 (docs: {running.url}/docs)")
    try:
        running._thread.join()
    except KeyboardInterrupt:
        running.stop()
