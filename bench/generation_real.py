"""Generation throughput of a pretrained model (SmolLM2-135M): ``bench_generation.py --model smollm2-135m``.

Why a separate module: the tiny bench measures the trainer's hot path on a 1M-parameter model, where
Python overhead rules; a 135M model is bound by matrix multiplies, so here the question is how close
generation comes to what the machine can compute. Per ``--concurrency`` c (c rows: c/G prompts, each
G times, as GRPO samples), in the same run and alternating, so all see the same load:

- TransformersBackend tokens/s against ``model.generate`` on the same rows (sampling, raw log-probs);
- the FLOP bound: the machine's best float32 matmul rate at the run's thread count, measured in the
  same run on large shapes (:data:`BOUND_SHAPES`: square 1024 and 2048, and the model's MLP with 4,096
  rows), in GFLOP/s; decoding one token costs about 2 x params FLOPs (the output layer included), so
  bound tokens/s = GFLOP/s / (2 x params). The prompts' prefill and attention are work on top, so no
  engine reaches 100%. (Before issue 38 the bound was a matmul of the decode step's own small shape,
  [c, hidden] x [hidden, intermediate], which sits below the machine's rate: a lower bound.)
- with ``--precision bfloat16``: the same backend generating from a bfloat16 copy of the float32
  model (``policy.generation.precision``; LoRA: the peft model's copy, adapters merged), against the
  same float32 bound and against the best bfloat16 matmul rate on the same shapes;
- with LoRA (``--lora-concurrency``, default: every ``--concurrency``; r=16 on every linear layer,
  random B): the peft-injected model through TransformersBackend, which is what the synchronous
  in-process trainer generates with (the backend merges the adapters into the weights for the call,
  ``lora_merged``), and a merged plain copy, each against the same bound;
- with ``--ab-forward-decode``: the backend running the model's forward per token instead of the
  written-out Llama decode step (``written_out_decode=False``), in float32 and in ``--precision``.

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


def matmul_gflops(rows: int, inner: int, outer: int, seconds: float = 0.5, dtype: str = "float32") -> float:
    """GFLOP/s of a [rows, inner] x [inner, outer] matmul in ``dtype``, timed for about ``seconds``."""
    import torch

    a, w = (
        torch.randn(rows, inner).to(getattr(torch, dtype)),
        torch.randn(inner, outer).to(getattr(torch, dtype)),
    )
    for _ in range(2):
        a @ w
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a @ w
        count += 1
    return 2.0 * rows * inner * outer * count / elapsed / 1e9


def bound_shapes(hidden: int, intermediate: int) -> list[tuple[int, int, int]]:
    """The large matmuls whose best rate is the bound: square 1024 and 2048, the MLP with 4,096 rows."""
    return [(1024, 1024, 1024), (2048, 2048, 2048), (4096, hidden, intermediate)]


def best_matmul_gflops(shapes: list[tuple[int, int, int]], dtype: str = "float32") -> float:
    """The best GFLOP/s over ``shapes`` (each timed about 0.5 s)."""
    return max(matmul_gflops(*shape, dtype=dtype) for shape in shapes)


def lora_pair(model: Any, rank: int) -> tuple[Any, Any]:
    """(the model with peft LoRA layers injected, unmerged; its merged plain copy). B is random, as
    after some training, so the adapter path computes something."""
    import torch

    from gym_bridge.train.config.policy import LoRAConfig
    from gym_bridge.train.learner.lora import apply_lora, merged_model

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

    def backend_for(m: Any, precision: str | None = None, written_out: bool = True) -> Any:
        backend = TransformersBackend(m, tokenizer, model_name="bench", threads=None, precision=precision)
        backend.eos_token_ids = set()  # every row makes exactly --new-tokens tokens
        backend.written_out_decode = written_out
        return backend

    def requests_for(prompts: list[list[int]]) -> list[Any]:
        sampling = {"max_new_tokens": args.new_tokens, "temperature": args.temperature}
        return [GenerationRequest(p, SamplingParams(**sampling, seed=i)) for i, p in enumerate(prompts)]

    def rows_of(c: int) -> list[list[int]]:
        group = min(args.group_size, c)
        return grpo_batch(tokenizer, max(1, c // group), group)[1]

    base = backend_for(model)
    concatenating = backend_for(model)  # the decode loop before issue 38: transformers' DynamicCache
    concatenating.preallocate_cache = False
    shapes = bound_shapes(hidden, intermediate)
    # name -> tokens made (engines) or GFLOP/s (the bound)
    runners: dict[str, Callable[[], float]] = {"matmul bound": lambda: best_matmul_gflops(shapes)}
    low = args.precision
    if low:
        runners[f"{low} matmul bound"] = lambda: best_matmul_gflops(shapes, low)
    concurrencies = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    lora_cs = (
        concurrencies
        if args.lora_concurrency is None
        else [args.lora_concurrency] * bool(args.lora_concurrency)
    )
    unmerged, merged = lora_pair(model, rank=16) if lora_cs else (None, None)
    for c in concurrencies:
        prompts = rows_of(c)
        reqs = requests_for(prompts)
        runners[f"backend c={c}"] = lambda b=base, r=reqs: ours(b, r, args.new_tokens)
        if low:
            runners[f"backend {low} c={c}"] = lambda b=backend_for(model, low), r=reqs: ours(
                b, r, args.new_tokens
            )
        if args.ab_dynamic_cache:
            runners[f"backend dynamic-cache c={c}"] = lambda b=concatenating, r=reqs: ours(
                b, r, args.new_tokens
            )
        if args.ab_forward_decode:
            for dtype in [None, low] if low else [None]:
                key = f"backend {dtype} forward-decode c={c}" if dtype else f"backend forward-decode c={c}"
                runners[key] = lambda b=backend_for(model, dtype, written_out=False), r=reqs: ours(
                    b, r, args.new_tokens
                )
        if args.compare_hf:
            runners[f"model.generate c={c}"] = lambda p=prompts: hf_generate(
                model, p, pad, args.new_tokens, args.temperature
            )
    for c in lora_cs:
        reqs = requests_for(rows_of(c))
        runners[f"lora unmerged c={c}"] = lambda b=backend_for(unmerged), r=reqs: ours(b, r, args.new_tokens)
        runners[f"lora merged c={c}"] = lambda b=backend_for(merged), r=reqs: ours(b, r, args.new_tokens)
        if low:
            runners[f"lora unmerged {low} c={c}"] = lambda b=backend_for(unmerged, low), r=reqs: ours(
                b, r, args.new_tokens
            )

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
        if name.endswith("matmul bound"):
            return statistics.median(values[name])
        return values[name][0] / statistics.median(seconds[name])

    gflops = rate("matmul bound")
    bound = gflops * 1e9 / (2 * params)
    low_gflops = rate(f"{low} matmul bound") if low else 0.0
    low_bound = low_gflops * 1e9 / (2 * params)
    bound_note = (
        f"baseline: the best fp32 matmul rate of the same run and threads, {gflops:.1f} GFLOP/s (median of "
        f"{repeats}, best of {', '.join('x'.join(map(str, s)) for s in shapes)}) / (2 x {params:,} params) = "
        f"{bound:.1f} tokens/s; ratio = fraction of the bound"
    )
    rows, shape = [], f"{args.model}, {args.new_tokens} new tokens, t={args.temperature}"
    for c in concurrencies:
        ours_rate = rate(f"backend c={c}")
        if args.compare_hf:
            rows.append(figure(
                f"TransformersBackend tokens/s ({shape}, c={c})", round(ours_rate, 1), "tokens/s",
                baseline=round(rate(f"model.generate c={c}"), 1),
                note=f"baseline: model.generate on the same rows and model, same run, alternating; median of {repeats}",
            ))  # fmt: skip
        if args.ab_dynamic_cache:
            rows.append(figure(
                f"TransformersBackend preallocated KV cache vs DynamicCache ({shape}, c={c})", round(ours_rate, 1),
                "tokens/s", baseline=round(rate(f"backend dynamic-cache c={c}"), 1),
                note="baseline: the same backend decoding with transformers' DynamicCache (which concatenates "
                "every layer's keys and values at each token; the loop before issue 38), same run, alternating; "
                f"median of {repeats}",
            ))  # fmt: skip
        for dtype in ([None, low] if low else [None]) if args.ab_forward_decode else []:
            tag = f" {dtype}" if dtype else ""
            rows.append(figure(
                f"TransformersBackend{tag} written-out decode step vs the model's forward ({shape}, c={c})",
                round(rate(f"backend{tag} c={c}"), 1), "tokens/s",
                baseline=round(rate(f"backend{tag} forward-decode c={c}"), 1),
                note="baseline: the same backend running the model's forward per token (written_out_decode=False, "
                f"the loop before session 21), same run, alternating; median of {repeats}",
            ))  # fmt: skip
        rows.append(figure(
            f"TransformersBackend share of the large-matmul bound ({shape}, c={c})", round(ours_rate, 1),
            "tokens/s", baseline=round(bound, 1), note=bound_note,
        ))  # fmt: skip
        if low:
            low_rate = rate(f"backend {low} c={c}")
            rows.append(figure(
                f"TransformersBackend {low} copy, share of the float32 large-matmul bound ({shape}, c={c})",
                round(low_rate, 1), "tokens/s", baseline=round(bound, 1),
                note=f"policy.generation.precision={low}: a {low} copy of the float32 model; {bound_note}",
            ))  # fmt: skip
            rows.append(figure(
                f"TransformersBackend {low} copy, share of the {low} large-matmul bound ({shape}, c={c})",
                round(low_rate, 1), "tokens/s", baseline=round(low_bound, 1),
                note=f"baseline: the best {low} matmul rate of the same run and shapes, {low_gflops:.1f} GFLOP/s "
                f"(median of {repeats}) / (2 x {params:,} params) = {low_bound:.1f} tokens/s",
            ))  # fmt: skip
    for c in lora_cs:
        for kind, what in (
            (
                "unmerged",
                "the peft-injected model (what the in-process trainer generates with; merged for the call)",
            ),
            ("merged", "the same adapter merged into a plain copy"),
        ):
            rows.append(figure(
                f"LoRA r=16 {kind} share of the large-matmul bound ({shape}, c={c})",
                round(rate(f"lora {kind} c={c}"), 1), "tokens/s", baseline=round(bound, 1),
                note=f"{what} through TransformersBackend, same run, alternating; {bound_note}",
            ))  # fmt: skip
        if low:
            rows.append(figure(
                f"LoRA r=16 unmerged, {low} copy, share of the float32 large-matmul bound ({shape}, c={c})",
                round(rate(f"lora unmerged {low} c={c}"), 1), "tokens/s", baseline=round(bound, 1),
                note=f"the peft-injected model through TransformersBackend(precision={low!r}): a {low} copy with "
                f"the adapters merged in (what the synchronous trainer generates with under "
                f"policy.generation.precision); {bound_note}",
            ))  # fmt: skip
    details = {
        "model": f"{args.model}: {type(model).__name__}, {params:,} parameters, hidden {hidden}, "
        f"intermediate {intermediate}, {config.num_hidden_layers} layers, vocab {config.vocab_size}, fp32",
        "torch_threads": torch.get_num_threads(),
        "bound_gflops": gflops,
        "bound_tokens_per_s": bound,
        "bound_shapes": shapes,
        "low_precision": low,
        "low_precision_bound_gflops": low_gflops if low else None,
        "repeats": repeats,
        "seconds": seconds,
        "values": values,
        "loadavg_end": os.getloadavg()[0],
    }
    path = write_results(RESULT_NAME, rows, quick=args.quick, details=details)
    print(
        f"{details['model']}; torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}"
    )
    for row in rows:
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        print(f"  {row['name']}: {row['value']:,} {row['unit']} vs {row['baseline']:,} -> ratio {ratio}")
    print(f"results: {path}")
