"""Ranking accuracy goes up after a few SFT steps on the better responses.

The groups are built so that only a model that reads the prompt can order them: each prompt's best
answer is another prompt's worse answer, so any prompt-blind preference for some answers gets at most
5 of the 8 pairs right (3 of the 4-cycle "own beats next", 2 of the 4 "own beats next but one"). A random tiny Llama starts near chance; a few plain cross-entropy steps on
(prompt, best response) make it order every group. (gym_bridge has no SFT trainer; the steps are
written here, on the same chat-templated prompt the scorer uses.)
"""

from __future__ import annotations

import torch

from gym_bridge.evaluation.ranked import evaluate_ranked
from gym_bridge.evaluation.scoring import ModelScorer, prompt_messages
from gym_bridge.models.tiny import TinyRecipe, random_tiny_model
from gym_bridge.models.tokenizer import build_tokenizer
from gym_bridge.records.chat import render_prompt

ANSWERS = {"sky": "blue", "grass": "green", "snow": "white", "coal": "black"}
NAMES = list(ANSWERS)


def groups() -> list[tuple[int, dict]]:
    """Per prompt: its own answer rank 1; the next two prompts' answers tied at rank 2."""
    out = []
    for i, name in enumerate(NAMES):
        others = [ANSWERS[NAMES[(i + k) % len(NAMES)]] for k in (1, 2)]
        members = [{"response": ANSWERS[name], "rank": 1}] + [{"response": o, "rank": 2} for o in others]
        out.append((i + 1, {"prompt": f"What colour is {name}?", "group": members}))
    return out


def sft_steps(model, tokenizer, steps: int, lr: float = 3e-3) -> None:
    """Cross-entropy on the best response's tokens (prompt tokens masked), one batch of all prompts."""
    rows, labels = [], []
    for _, record in groups():
        prompt = render_prompt(tokenizer, prompt_messages(record["prompt"]))
        answer = tokenizer(record["group"][0]["response"], add_special_tokens=False)["input_ids"]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    label_ids = torch.tensor([x + [-100] * (width - len(x)) for x in labels])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=input_ids, attention_mask=attention, labels=label_ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def test_sft_on_the_better_responses_makes_the_model_order_the_groups():
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = random_tiny_model(tokenizer, TinyRecipe(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128))
    scorer = ModelScorer(model, tokenizer)

    before = evaluate_ranked(groups(), scorer).summary()
    # 4 groups x 2 pairs (the two rank-2 members are tied in rank: that pair is not counted).
    assert before["pairs"] == 8
    assert before["pairwise_accuracy"] < 1.0

    sft_steps(model, tokenizer, steps=40)
    after = evaluate_ranked(groups(), scorer).summary()
    assert after["pairwise_accuracy"] == 1.0  # above the 5/8 a prompt-blind scorer can reach (0.375 before)
    assert after["top1_accuracy"] == 1.0
    assert after["kendall_tau"] > before["kendall_tau"]
