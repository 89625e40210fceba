"""Generation throughput of a pretrained model (SmolLM2-135M): ``bench_generation.py --model smollm2-135m``.

Why a separate module: the tiny bench measures the trainer's hot path on a 1M-parameter model, where
Python overhead rules; a 135M model is bound by matrix multiplies, so here the question is how close
generation comes to what the machine can compute. Per ``--concurrency`` c (c rows: c/G prompts, each
G times, as GRPO samples), in the same run and alternating, so all see the same load:

- TransformersBackend tokens/s against ``model.generate`` on the same rows (sampling, raw log-probs);
- the FLOP bound: a float32 matmul of the model's MLP shape, [c, hidden] x [hidden, intermediate],
  in GFLOP/s; decoding one token costs about 2 x params FLOPs, so bound tokens/s = GFLOP/s / (2 x
  params) (attention over the short contexts here adds under 1%);
- with LoRA (``--lora-concurrency`` rows, r=16 on every linear layer, random B): the peft-injected
  model through TransformersBackend, which is what the synchronous in-process trainer generates with
  (since the ``lora_merged`` change the backend swaps merged weights in for the call; before it, the
  unmerged model ran at 0.75x of the merged copy), against a merged copy.

Results: bench/results/generation_smollm2.json (bench contract). Threads: ``--threads`` pins torch's
thread count for every engine and for the matmul alike (0: torch's default).
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench_generation import grpo_batch, hf_generate, ours
from common import figure, write_results

RESULT_NAME = "generation_smollm2"


def matmul_gflops(rows: int, inner: int, outer: int, seconds: float = 0.5) -> float:
    """GFLOP/s of a float32 [rows, inner] x [inner, outer] matmul, timed for about ``seconds``."""
    import torch

    a, w = torch.randn(rows, inner), torch.randn(inner, outer)
    for _ in range(3):
        a @ w
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(10):
            a @ w
        count += 10
    return 2.0 * rows * inner * outer * count / elapsed / 1e9


def lora_pair(model: Any, rank: int) -> tuple[Any, Any]:
    """(the model with peft LoRA layers injected, unmerged; its merged plain copy). B is random, as
    after some training, so the adapter path computes something."""
    import torch

    from gym_bridge.train.config.policy import LoRAConfig
    from gym_bridge.train.lora import apply_lora, merged_model

    adapted = copy.deepcopy(model)
    peft_model = apply_lora(adapted, LoRAConfig(enabled=True, dim=rank, alpha=2 * rank))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.01)
    merged = merged_model(peft_model).eval()
    return adapted.eval(), merged


def main(args: Any) -> None:
    import torch

    from gym_bridge.generation.backend import GenerationRequest, SamplingParams
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.models.registry import load_model_and_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (2 if args.quick else 3)
    model, tokenizer = load_model_and_tokenizer(args.model)
    config = model.config
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    hidden, intermediate = config.hidden_size, config.intermediate_size
    pad = tokenizer.pad_token_id

    def backend_for(m: Any) -> Any:
        backend = TransformersBackend(m, tokenizer, model_name="bench", threads=None)  # --threads rules
        backend.eos_token_ids = set()  # every row makes exactly --new-tokens tokens
        return backend

    def requests_for(prompts: list[list[int]]) -> list[Any]:
        sampling = {"max_new_tokens": args.new_tokens, "temperature": args.temperature}
        return [GenerationRequest(p, SamplingParams(**sampling, seed=i)) for i, p in enumerate(prompts)]

    def rows_of(c: int) -> list[list[int]]:
        group = min(args.group_size, c)
        return grpo_batch(tokenizer, max(1, c // group), group)[1]

    base = backend_for(model)
    runners: dict[str, Callable[[], float]] = {}  # name -> tokens made (engines) or GFLOP/s (matmul)
    concurrencies = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    for c in concurrencies:
        prompts = rows_of(c)
        reqs = requests_for(prompts)
        runners[f"backend c={c}"] = lambda b=base, r=reqs: ours(b, r, args.new_tokens)
        runners[f"model.generate c={c}"] = lambda p=prompts: hf_generate(
            model, p, pad, args.new_tokens, args.temperature
        )
        runners[f"matmul c={c}"] = lambda c=c: matmul_gflops(c, hidden, intermediate)
    lora_c = args.lora_concurrency
    if lora_c:
        unmerged, merged = lora_pair(model, rank=16)
        reqs = requests_for(rows_of(lora_c))
        runners[f"lora unmerged c={lora_c}"] = lambda b=backend_for(unmerged), r=reqs: ours(b, r, args.new_tokens)
        runners[f"lora merged c={lora_c}"] = lambda b=backend_for(merged), r=reqs: ours(b, r, args.new_tokens)

    seconds: dict[str, list[float]] = {name: [] for name in runners}
    values: dict[str, list[float]] = {name: [] for name in runners}
    for run in runners.values():
        run()  # warm-up
    order = list(runners)
    for repeat in range(repeats):
        for name in order[repeat % len(order) :] + order[: repeat % len(order)]:
            start = time.perf_counter()
            values[name].append(float(runners[name]()))
            seconds[name].append(time.perf_counter() - start)
            print(f"  [{repeat + 1}/{repeats}] {name}: {seconds[name][-1]:.2f} s", flush=True)

    def rate(name: str) -> float:
        if name.startswith("matmul"):
            return statistics.median(values[name])
        return values[name][0] / statistics.median(seconds[name])

    rows, shape = [], f"{args.model}, {args.new_tokens} new tokens, t={args.temperature}"
    for c in concurrencies:
        ours_rate, hf_rate, gflops = rate(f"backend c={c}"), rate(f"model.generate c={c}"), rate(f"matmul c={c}")
        bound = gflops * 1e9 / (2 * params)
        rows.append(figure(
            f"TransformersBackend tokens/s ({shape}, c={c})", round(ours_rate, 1), "tokens/s",
            baseline=round(hf_rate, 1),
            note=f"baseline: model.generate on the same rows and model, same run, alternating; median of {repeats}",
        ))  # fmt: skip
        rows.append(figure(
            f"TransformersBackend share of the FLOP bound ({shape}, c={c})", round(ours_rate, 1), "tokens/s",
            baseline=round(bound, 1),
            note=f"baseline: {gflops:.1f} GFLOP/s ([{c}, {hidden}] x [{hidden}, {intermediate}] fp32 matmul, "
            f"same run) / (2 x {params:,} params); ratio = fraction of the bound",
        ))  # fmt: skip
    if lora_c:
        un, me = rate(f"lora unmerged c={lora_c}"), rate(f"lora merged c={lora_c}")
        rows.append(figure(
            f"LoRA r=16 trainer model tokens/s ({shape}, c={lora_c})", round(un, 1), "tokens/s",
            baseline=round(me, 1),
            note="the peft-injected model through TransformersBackend (merged for the call); baseline: the "
            "same adapter merged into a plain copy, same run, alternating",
        ))  # fmt: skip
    details = {
        "model": f"{args.model}: {type(model).__name__}, {params:,} parameters, hidden {hidden}, "
        f"intermediate {intermediate}, {config.num_hidden_layers} layers, vocab {config.vocab_size}, fp32",
        "torch_threads": torch.get_num_threads(),
        "repeats": repeats,
        "seconds": seconds,
        "values": values,
        "loadavg_end": os.getloadavg()[0],
    }
    path = write_results(RESULT_NAME, rows, quick=args.quick, details=details)
    print(f"{details['model']}; torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    for row in rows:
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        print(f"  {row['name']}: {row['value']:,} {row['unit']} vs {row['baseline']:,} -> ratio {ratio}")
    print(f"results: {path}")
