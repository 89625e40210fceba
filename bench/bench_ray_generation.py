"""Ray scale-out of generation: 1 and 2 replicas against the in-process backend, same run.

    .venv/bin/python bench/bench_ray_generation.py            # tiny and small shapes, 5 alternating repeats
    .venv/bin/python bench/bench_ray_generation.py --quick    # tiny shape, 3 repeats

The batch is one GRPO step of recipes/grpo_math_tiny.yaml: ``--prompts`` arithmetic chat prompts, each
``--group-size`` times (8 x 8 = 64 requests), ``--new-tokens`` each with no stop token (every row makes
exactly that many tokens, checked), seeded per row. Three generators decode it alternately, so they see
the same machine load: the in-process ``TransformersBackend`` on one torch thread (what the trainer
uses for small models; the baseline), and ``RayBackend`` with 1 and with 2 replicas of one thread each
in a private loopback Ray (3 logical CPUs). All three return the same tokens (checked). Figures are
generated tokens per second of wall time around ``generate`` (median of the repeats), and the weight
refit (``update_weights``: one ``ray.put`` of the state_dict, every replica loads it).

Shapes: ``tiny`` is the trainer's tiny Llama (hidden 128, 4 layers, ~1.2M parameters, random weights);
``small`` is hidden 512, 8 layers, MLP 2048 (~26M parameters), where decode steps cost enough for the
per-call Ray overhead (~10 ms) to matter less. Results: bench/results/ray_generation.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, write_results  # noqa: E402

SHAPES = {
    "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 512},
    "small": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 2048},
}


def grpo_requests(tokenizer: Any, prompts: int, group_size: int, new_tokens: int) -> list[Any]:
    from gym_bridge.data.arithmetic import make_problems, prompt_for
    from gym_bridge.generation.backend import GenerationRequest, SamplingParams

    requests = []
    for i, problem in enumerate(make_problems(prompts, seed=0)):
        messages = [{"role": "user", "content": prompt_for(problem["question"])}]
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for g in range(group_size):
            params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=1000 * i + g)
            requests.append(GenerationRequest(list(ids), params))
    return requests


def no_stop_tokens(replica: Any) -> None:
    """Runs inside a replica actor: no EOS, so every row makes exactly max_new_tokens tokens."""
    replica.backend.eos_token_ids = set()


def bench_shape(
    shape: str, args: argparse.Namespace, repeats: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import ray

    from gym_bridge.generation.ray_backend import RayBackend
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.models.tiny import TinyRecipe, random_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = random_tiny_model(tokenizer, TinyRecipe(**SHAPES[shape]), seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    requests = grpo_requests(tokenizer, args.prompts, args.group_size, args.new_tokens)
    expected_tokens = len(requests) * args.new_tokens

    local = TransformersBackend(model, tokenizer)
    local.eos_token_ids = set()
    generators: dict[str, Any] = {"in-process": local}
    for n in (1, 2):
        backend = RayBackend(model, tokenizer, num_workers=n, threads_per_worker=1)
        ray.get([r.__ray_call__.remote(no_stop_tokens) for r in backend.replicas])
        generators[f"ray x{n}"] = backend

    seconds: dict[str, list[float]] = {name: [] for name in generators}
    reference = None
    try:
        for name, generator in generators.items():  # warm-up, and the same tokens everywhere
            results = generator.generate(requests)
            assert sum(len(r.token_ids) for r in results) == expected_tokens, name
            tokens = [r.token_ids for r in results]
            assert reference is None or tokens == reference, f"{name} sampled other tokens"
            reference = tokens
        for _ in range(repeats):
            for name, generator in generators.items():
                started = time.perf_counter()
                generator.generate(requests)
                seconds[name].append(time.perf_counter() - started)
        refit_s = []
        for _ in range(repeats):
            started = time.perf_counter()
            generators["ray x2"].update_weights(model)
            refit_s.append(time.perf_counter() - started)
    finally:
        for name, generator in generators.items():
            if name != "in-process":
                generator.close()

    tps = {name: expected_tokens / statistics.median(s) for name, s in seconds.items()}
    label = f"{shape} ({n_params / 1e6:.1f}M params), {len(requests)} requests x {args.new_tokens} tokens"
    note = "baseline: in-process TransformersBackend, 1 thread, same run; higher is better"
    rows = [
        figure(f"Ray 2 replicas, {label}", tps["ray x2"], "tokens/s", baseline=tps["in-process"], note=note),
        figure(f"Ray 1 replica, {label}", tps["ray x1"], "tokens/s", baseline=tps["in-process"], note=note),
        figure(
            f"Ray 2 vs 1 replica, {label}",
            tps["ray x2"],
            "tokens/s",
            baseline=tps["ray x1"],
            note="baseline: the same backend with 1 replica, same run; higher is better",
        ),
        figure(
            f"Ray refit into 2 replicas, {shape} ({n_params * 4 / 2**20:.1f} MiB fp32)",
            statistics.median(refit_s) * 1000,
            "ms",
            note="update_weights: ray.put of the state_dict once, every replica loads it; lower is better",
        ),
    ]
    details = {"seconds": seconds, "refit_s": refit_s, "params": n_params, "tokens": expected_tokens}
    return rows, details


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument(
        "--repeats", type=int, default=None, help="alternating timed runs (default 5, quick 3)"
    )
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES), help="default: tiny and small")
    parser.add_argument("--quick", action="store_true", help="tiny shape, 3 repeats")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)
    shapes = args.shape or (["tiny"] if args.quick else ["tiny", "small"])

    import ray
    import torch

    from gym_bridge.distributed.ray_local import start_local_ray

    torch.set_num_threads(1)
    start_local_ray(num_cpus=3, object_store_memory_mb=200)  # both backends' replicas at once
    rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    try:
        for shape in shapes:
            shape_rows, details[shape] = bench_shape(shape, args, repeats)
            rows += shape_rows
            for row in shape_rows:
                print(
                    f"{row['name']}: {row['value']:.1f} {row['unit']}"
                    + (f" (baseline {row['baseline']:.1f}, x{row['ratio']:.2f})" if row["baseline"] else ""),
                    flush=True,
                )
    finally:
        ray.shutdown()
    path = write_results("ray_generation", rows, quick=args.quick, details=details)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
