"""Generation throughput on the GRPO shape: our TransformersBackend against ``model.generate``, same run.

    .venv/bin/python bench/bench_generation.py            # 7 alternating repeats
    .venv/bin/python bench/bench_generation.py --quick    # 3 repeats
    .venv/bin/python bench/bench_generation.py --prompts 8 --group-size 8 --new-tokens 16 --threads 1

The batch is what one GRPO step of recipes/grpo_math_tiny.yaml samples: ``--prompts`` arithmetic chat
prompts (gym_bridge.data.arithmetic, through the local chat template), each ``--group-size`` times
(8 x 8 = 64 rows), ``--new-tokens`` new tokens each, on the tiny Llama shape of the shared notes
(hidden 128, 4 layers, MLP 512, the local byte-level BPE vocabulary, about 1.15M parameters, fp32,
random weights). Both sides work under identical conditions: the same model object, the same 64 token
sequences, pure sampling at ``--temperature`` (no top-k, no top-p), no stop token (every row makes
exactly ``--new-tokens`` tokens, checked), and both hand back each sampled token's raw-model
log-probability (``model.generate`` through ``output_logits`` + log-softmax, timed with it). They run
alternately, so both see the same machine load.

A third figure serves the same 64 requests to the policy server (``/v1/responses`` over loopback HTTP,
concurrent, batched into one ``generate``) against the backend called directly: the HTTP and batching
overhead the online trainer pays (pessimistic: the httpx client runs in the same process).
Results go to bench/results/generation_throughput.json in the bench contract (bench/README.md).
The shared notes' peer figure: TRL's GRPOTrainer generated about 2,100-2,400 tokens/s on this shape.

``--model smollm2-135m`` measures the pretrained 135M model instead (generation_real.py: per
``--concurrency``, tokens/s against the machine's best large-matmul rate measured in the same run, for
the model and for LoRA unmerged and merged); its results go to bench/results/generation_smollm2.json:

    .venv/bin/python bench/bench_generation.py --model smollm2-135m --concurrency 16,64 --new-tokens 24 \
        --repeats 3 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, write_results  # noqa: E402

RESULT_NAME = "generation_throughput"


def tiny_llama(tokenizer: Any) -> Any:
    """The shared notes' TRL-peer shape (the tiny model's, untied embeddings) with the local vocabulary."""
    from gym_bridge.models.tiny import TinyRecipe, random_tiny_model

    return random_tiny_model(tokenizer, TinyRecipe(), seed=0)


def grpo_batch(
    tokenizer: Any, prompts: int, group_size: int
) -> tuple[list[list[dict[str, str]]], list[list[int]]]:
    """``prompts`` arithmetic questions, each repeated ``group_size`` times: chat messages and token ids."""
    from gym_bridge.data.arithmetic import make_problems, prompt_for

    conversations, ids = [], []
    for problem in make_problems(prompts, seed=0):
        messages = [{"role": "user", "content": prompt_for(problem["question"])}]
        tokens = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        conversations += [messages] * group_size
        ids += [list(tokens)] * group_size
    return conversations, ids


def hf_generate(
    model: Any, prompts: list[list[int]], pad_id: int, new_tokens: int, temperature: float
) -> int:
    """``model.generate`` on the left-padded batch, with the raw log-probability of every sampled token."""
    import torch
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    starts = torch.tensor([width - len(p) for p in prompts])
    mask = (torch.arange(width)[None, :] >= starts[:, None]).long()
    config = GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        eos_token_id=None,  # as our side: no stop token, every row makes exactly new_tokens tokens
        pad_token_id=pad_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        sampled = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()  # [rows, steps, vocab], unprocessed
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    if sampled.shape != (len(prompts), new_tokens) or logprobs.shape != sampled.shape:
        raise RuntimeError(
            f"model.generate made {tuple(sampled.shape)} tokens, expected {(len(prompts), new_tokens)}"
        )
    return int(sampled.numel())


def ours(backend: Any, requests: list[Any], new_tokens: int) -> int:
    results = backend.generate(requests)
    if any(len(r.token_ids) != new_tokens or len(r.logprobs) != new_tokens for r in results):
        raise RuntimeError("a row did not make exactly --new-tokens tokens")
    return sum(len(r.token_ids) for r in results)


def served(url: str, conversations: list[list[dict[str, str]]], new_tokens: int, temperature: float) -> int:
    """The same rows as concurrent ``/v1/responses`` requests with training fields (the trainer's path)."""
    import httpx

    async def burst() -> int:
        limits = httpx.Limits(max_connections=len(conversations))
        async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
            bodies = [
                {"input": messages, "max_output_tokens": new_tokens, "temperature": temperature, "seed": i,
                 "return_token_ids": True}
                for i, messages in enumerate(conversations)
            ]  # fmt: skip
            replies = await asyncio.gather(*(client.post("/v1/responses", json=b) for b in bodies))
        counts = [len(r.raise_for_status().json()["output"][-1]["generation_token_ids"]) for r in replies]
        if any(c != new_tokens for c in counts):
            raise RuntimeError(f"served rows made {counts} tokens, expected {new_tokens} each")
        return sum(counts)

    return asyncio.run(burst())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument(
        "--repeats", type=int, default=None, help="alternating timed runs (default 7, quick 3)"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--compare-hf", action=argparse.BooleanOptionalAction, default=True, help="time model.generate too"
    )
    parser.add_argument(
        "--server", action=argparse.BooleanOptionalAction, default=True, help="time the policy server"
    )
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--model", default="tiny", help="tiny (random, the default) or smollm2-135m")
    parser.add_argument("--concurrency", default="16,64", help="smollm2: rows per batch, one row each")
    parser.add_argument(
        "--lora-concurrency",
        type=int,
        default=None,
        help="smollm2: rows of the LoRA rows (default: each --concurrency; 0: none)",
    )
    parser.add_argument(
        "--ab-dynamic-cache",
        action="store_true",
        help="smollm2: also time the backend with transformers' DynamicCache (the decode loop before issue 38)",
    )
    parser.add_argument(
        "--ab-forward-decode",
        action="store_true",
        help="smollm2: also time the backend running the model's forward per token instead of the written-out "
        "Llama decode step (gym_bridge/generation/llama_decode.py), in float32 and in --precision",
    )
    parser.add_argument(
        "--precision",
        default=None,
        choices=["bfloat16", "float16"],
        help="smollm2: also time the backend generating in this dtype (policy.generation.precision: a copy of "
        "the float32 model), the LoRA rows too, and the same dtype's large-matmul rate",
    )
    args = parser.parse_args()
    if args.model != "tiny":
        from generation_real import main as real_main

        real_main(args)
        return
    repeats = args.repeats or (3 if args.quick else 7)

    import torch

    from gym_bridge.generation.backend import GenerationRequest, SamplingParams
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.models.tokenizer import build_tokenizer
    from gym_bridge.policy.server import build_policy_app
    from gym_bridge.serving.uvicorn_thread import start_in_thread

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    backend = TransformersBackend(model, tokenizer, model_name="bench", threads=None)  # --threads rules
    backend.eos_token_ids = set()  # no stop token: every row makes exactly --new-tokens tokens
    conversations, prompts = grpo_batch(tokenizer, args.prompts, args.group_size)
    requests = [
        GenerationRequest(
            p, SamplingParams(max_new_tokens=args.new_tokens, temperature=args.temperature, seed=i)
        )
        for i, p in enumerate(prompts)
    ]

    runners: dict[str, Callable[[], int]] = {"backend": lambda: ours(backend, requests, args.new_tokens)}
    if args.compare_hf:
        runners["model.generate"] = lambda: hf_generate(
            model, prompts, tokenizer.pad_token_id, args.new_tokens, args.temperature
        )
    app = build_policy_app(backend, model_name="bench", batch_wait_ms=20.0)
    with start_in_thread(app) as running:
        if args.server:
            runners["policy server"] = lambda: served(
                running.url, conversations, args.new_tokens, args.temperature
            )
        seconds: dict[str, list[float]] = {name: [] for name in runners}
        tokens: dict[str, int] = {}
        for run in runners.values():
            run()  # warm-up
        order = list(runners)
        for repeat in range(repeats):
            for name in order[repeat % len(order) :] + order[: repeat % len(order)]:  # rotate who goes first
                start = time.perf_counter()
                tokens[name] = runners[name]()
                seconds[name].append(time.perf_counter() - start)
    batch_sizes = list(app.service.batcher.stats.batch_sizes)

    median = {name: statistics.median(s) for name, s in seconds.items()}
    rate = {name: tokens[name] / median[name] for name in runners}
    shape = f"{args.prompts}x{args.group_size} GRPO batch, {args.new_tokens} new tokens"
    peer = "TRL GRPOTrainer's ~2,100-2,400 tokens/s on this shape (shared notes, not this run)"
    rows = [
        figure(
            f"TransformersBackend tokens/s ({shape})",
            round(rate["backend"], 1),
            "tokens/s",
            baseline=round(rate["model.generate"], 1) if args.compare_hf else None,
            note="baseline: transformers model.generate on the same model, rows and sampling, with raw log-probs, "
            f"same run, alternating; median of {repeats}; higher is better. For reference: {peer}",
        ),
        figure(
            f"TransformersBackend ms per batch ({shape})",
            round(median["backend"] * 1000, 1),
            "ms",
            baseline=round(median["model.generate"] * 1000, 1) if args.compare_hf else None,
            note="baseline: model.generate, same run; lower is better",
        ),
    ]
    if args.server:
        rows.append(
            figure(
                f"policy server tokens/s ({shape}, {len(prompts)} concurrent /v1/responses)",
                round(rate["policy server"], 1),
                "tokens/s",
                baseline=round(rate["backend"], 1),
                note="baseline (ceiling): the backend called directly, same run; the gap is HTTP, JSON and "
                "batching wait; higher is better",
            )
        )
    details = {
        "model": f"LlamaForCausalLM, {n_params:,} parameters, vocab {len(tokenizer)}, fp32, random weights",
        "rows": len(prompts),
        "prompt_tokens_mean": statistics.mean(len(p) for p in prompts),
        "new_tokens": args.new_tokens,
        "temperature": args.temperature,
        "torch_threads": torch.get_num_threads(),
        "repeats": repeats,
        "seconds": seconds,
        "tokens_per_run": tokens,
        "server_batch_sizes": batch_sizes,
        "loadavg_end": os.getloadavg()[0],
    }
    path = write_results(RESULT_NAME, rows, quick=args.quick, details=details)

    print(
        f"model: Llama {n_params:,} params, vocab {len(tokenizer)}; {len(prompts)} rows ({shape}), prompt "
        f"~{details['prompt_tokens_mean']:.0f} tokens, torch threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for name in runners:
        print(
            f"  {name:16s} median {median[name] * 1000:7.1f} ms/batch  {rate[name]:8,.0f} tokens/s "
            f"(best {tokens[name] / min(seconds[name]):,.0f})"
        )
    if args.compare_hf:
        print(f"  backend / model.generate: {rate['backend'] / rate['model.generate']:.2f}x")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
