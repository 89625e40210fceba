"""Base accuracy of SmolLM2-135M-Instruct on the task families of gym_bridge.data.families, as the
math server grades it, per prompt format, temperature and extraction mode.

Why: a GRPO recipe on a pretrained model needs a task the model solves sometimes (about 10-50%) in a
format the verifier reads; this measures that before any training. Completions are sampled with the
trainer's own transformers backend (same seeds, same sampler) and graded with the math server's own
extraction and comparison code (``boxed`` = NeMo Gym's rule, ``boxed_or_final`` = also "The answer
is N.").

    PYTHONPATH=$PWD python bench/smollm2_base_accuracy.py --families add_sub word --formats phrase \
        --temperatures 0.7 --n 60

Results are appended to bench/results/smollm2_base_accuracy.jsonl (one line per cell).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from gym_bridge.data.families import FAMILIES, PROMPT_FORMATS, messages_for, split_problems
from gym_bridge.generation.backend import GenerationRequest, SamplingParams
from gym_bridge.generation.transformers_backend import TransformersBackend
from gym_bridge.models.registry import load_model_and_tokenizer
from resources_servers.math.extraction import extract_answer
from resources_servers.math.fastpath import compare_plain
from resources_servers.math.strict import phrase_violation
from resources_servers.math.worker import check

RESULTS = Path(__file__).resolve().parent / "results" / "smollm2_base_accuracy.jsonl"


def grade(expected: str, text: str, mode: str) -> tuple[float, str]:
    """Reward (0/1) and extraction method ('none' when nothing was extracted) as the math server decides."""
    found = extract_answer(text, mode)  # type: ignore[arg-type]
    if found is None:
        return 0.0, "none"
    if found.phrase is not None and phrase_violation(found.phrase, expected) is not None:
        return 0.0, found.method  # the server refuses a phrase that does not state one value
    plain = compare_plain(expected, found.answer)
    correct = plain[0] if plain is not None else check(expected, found.answer)["correct"]
    return float(correct), found.method


def measure(backend: TransformersBackend, family: str, problems: list[dict[str, Any]], prompt_format: str,
            temperature: float, max_new_tokens: int, samples: int, seed: int) -> dict[str, Any]:
    tok = backend.tokenizer
    requests = []
    for i, p in enumerate(problems):
        ids = tok.apply_chat_template(messages_for(p["question"], prompt_format, family), add_generation_prompt=True,
                                      tokenize=True)
        ids = list(ids["input_ids"]) if isinstance(ids, dict) or hasattr(ids, "keys") else list(ids)
        for s in range(samples):
            params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed * 100003 + i * 31 + s)
            requests.append(GenerationRequest(prompt_token_ids=ids, params=params))
    start = time.perf_counter()
    results = []
    for b in range(0, len(requests), 32):
        results += backend.generate(requests[b : b + 32])
    seconds = time.perf_counter() - start
    out: dict[str, Any] = {"worked_examples": "per family (families.WORKED_EXAMPLES)", "generation_s": round(seconds, 1),
                           "tokens": sum(len(r.token_ids) for r in results),
                           "prompt_tokens": len(requests[0].prompt_token_ids)}
    for mode in ("boxed", "boxed_or_final"):
        grades = [grade(problems[i // samples]["answer"], r.text, mode) for i, r in enumerate(results)]
        out[f"accuracy_{mode}"] = round(sum(g for g, _ in grades) / len(grades), 3)
        out[f"methods_{mode}"] = dict(Counter(m for _, m in grades))
    if samples > 1:
        boxed_or_final = [grade(problems[i // samples]["answer"], r.text, "boxed_or_final")[0] for i, r in enumerate(results)]
        out[f"pass@{samples}_boxed_or_final"] = round(
            sum(max(boxed_or_final[j : j + samples]) for j in range(0, len(results), samples)) / len(problems), 3
        )
    out["examples"] = [r.text for r in results[:3]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=sorted(FAMILIES))
    parser.add_argument("--formats", nargs="+", default=["phrase", "phrase_one_shot"], choices=PROMPT_FORMATS)
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.7])
    parser.add_argument("--n", type=int, default=60, help="validation problems per family (held out split)")
    parser.add_argument("--samples", type=int, default=1, help="completions per problem")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = load_model_and_tokenizer("smollm2-135m")
    print(f"loaded in {time.perf_counter() - t0:.1f} s")
    backend = TransformersBackend(model, tok, model_name="smollm2-135m")
    for family in args.families:
        _, val = split_problems(family, n_val=200)
        problems = val[: args.n]
        for prompt_format in args.formats:
            for temperature in args.temperatures:
                cell = {"family": family, "prompt_format": prompt_format, "temperature": temperature,
                        "n_problems": len(problems), "samples": args.samples,
                        "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                        **measure(backend, family, problems, prompt_format, temperature, args.max_new_tokens,
                                  args.samples, args.seed)}
                print(json.dumps(cell), flush=True)
                RESULTS.parent.mkdir(exist_ok=True)
                with RESULTS.open("a") as f:
                    f.write(json.dumps(cell) + "\n")


if __name__ == "__main__":
    main()
