"""Rollout files for the viewer tests: small, hand-checkable, in each record shape the viewer reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def rollout(
    task: int,
    repeat: int,
    reward: float,
    answer: str | None,
    *,
    question: str | None = None,
    env: str = "math",
    failure_kind: str | None = None,
    text: str | None = None,
    tokens: tuple[list[int], list[float]] | None = None,
    tool_call: bool = False,
) -> dict[str, Any]:
    """A NeMo Gym rollout record as ``gym-bridge collect`` writes it."""
    question = question or f"What is {task} + {task}? Put the answer in \\boxed{{}}."
    output: list[dict[str, Any]] = []
    if tool_call:
        output += [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should look it up."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}',
             "id": "fc_1", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_1", "output": '{"weather_description": "cold"}'},
        ]
    message: dict[str, Any] = {
        "type": "message", "id": f"msg_{task}_{repeat}", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text if text is not None else f"The answer is \\boxed{{{answer}}}",
                     "annotations": []}],
    }
    if tokens is not None:
        message["prompt_token_ids"] = [1, 2, 3]
        message["generation_token_ids"], message["generation_log_probs"] = tokens
    output.append(message)
    rec: dict[str, Any] = {
        "responses_create_params": {"input": [{"role": "user", "content": question, "type": "message"}],
                                    "temperature": 1.0},
        "response": {"id": f"resp_{task}_{repeat}", "object": "response", "created_at": 0.0, "model": "tiny",
                     "status": "completed", "output": output,
                     "usage": {"input_tokens": 20, "output_tokens": 10 + repeat, "total_tokens": 30 + repeat}},
        "reward": reward,
        "agent_ref": {"name": env},
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
    }
    if answer is not None:
        rec["extracted_answer"] = answer
    if failure_kind is not None:
        rec["failure_kind"] = failure_kind
        rec["failure_reason"] = f"{failure_kind} happened"
    return rec


def write_jsonl(path: Path, records: list[Any], extra_lines: list[bytes] = ()) -> Path:
    with open(path, "wb") as f:
        for rec in records:
            f.write(json.dumps(rec).encode() + b"\n")
        for line in extra_lines:
            f.write(line)
    return path


def run_a() -> list[dict[str, Any]]:
    """Three math tasks x 4 rollouts and one tool_use task x 2.

    task 0: rewards 0,0,1,0 (answers 1,1,0,7): mean 0.25, pass@4 = 1, majority@4 = 0 (the wrong "1" wins
    the vote); GRPO advantages (leave-one-out, std-normalised): 1.0 for the correct one (its siblings'
    rewards have no spread, so it is left unscaled) and -(1/3)/sqrt(1/3) = -0.577 for the others.
    task 1: all wrong (one verifier_timeout), mean 0.
    task 2: all right, mean 1; its prompt mentions "zebra".
    task 3 (tool_use): 1, 0 with a function call and a reasoning item.
    """
    recs = []
    for r, (reward, ans) in enumerate([(0.0, "1"), (0.0, "1"), (1.0, "0"), (0.0, "7")]):
        recs.append(rollout(0, r, reward, ans, tokens=([11, 12, 13], [-0.05, -2.5, -0.7]) if r == 0 else None))
    for r in range(4):
        fk = "verifier_timeout" if r == 3 else None
        recs.append(rollout(1, r, 0.0, "5" if r < 3 else None, failure_kind=fk))
    for r in range(4):
        recs.append(rollout(2, r, 1.0, "4", question="How many legs does a zebra have? \\boxed{}"))
    recs.append(rollout(3, 0, 1.0, None, env="tool_use", tool_call=True, text="It is cold in Paris."))
    recs.append(rollout(3, 1, 0.0, None, env="tool_use", tool_call=True, text="<script>alert(1)</script> sunny"))
    return recs


def run_b() -> list[dict[str, Any]]:
    """Same tasks: task 0 now all right (flips to pass), task 2 now all wrong (flips to fail), 1 unchanged."""
    recs = []
    for r in range(4):
        recs.append(rollout(0, r, 1.0, "0"))
    for r in range(4):
        recs.append(rollout(1, r, 0.0, "5"))
    for r in range(4):
        recs.append(rollout(2, r, 0.0, "3", question="How many legs does a zebra have? \\boxed{}"))
    return recs


def nemo_rl_line(reward: float, prompt: list[int], generated: list[int], gen_lp: list[float],
                 prev_lp: list[float], advantage: float) -> dict[str, Any]:
    """A line of NeMo RL's ``train_data_step{N}.jsonl`` for a NeMo Gym rollout: token ids, no text."""
    n = len(prompt) + len(generated)
    return {
        "content": "",
        "rewards": reward,
        "input_lengths": n,
        "token_ids": prompt + generated,
        "token_loss_mask": [0] * len(prompt) + [1] * len(generated),
        "sample_loss_mask": 1,
        "advantages": [0.0] * len(prompt) + [advantage] * len(generated),
        "generation_logprobs": [0.0] * len(prompt) + gen_lp,
        "prev_logprobs": [0.0] * len(prompt) + prev_lp,
    }
