"""collect --policy: the embedded policy server is started for the run and serves the rollouts."""

from __future__ import annotations

import pytest
from collect_helpers import read_jsonl, write_rows
from fake_model import arithmetic_row

from gym_bridge.collect import CollectConfig, CollectError, collect


def save_tiny_random_model(path) -> None:
    """A random 2-layer Llama with the local tokenizer, saved as a Hugging Face directory (no network)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gym_bridge.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def test_policy_serves_the_run(tmp_path, boxed_env):
    model_dir = tmp_path / "tiny"
    save_tiny_random_model(model_dir)
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1), arithmetic_row(2, 2)])
    config = CollectConfig(
        tasks, tmp_path / "r.jsonl", [boxed_env[0]], policy=str(model_dir), num_repeats=2, seed=3,
        overrides={"max_output_tokens": 6, "temperature": 1.0}, progress=False,
    )  # fmt: skip
    result = collect(config)
    records = read_jsonl(result.output_path)
    assert result.failed == 0
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in records) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    for rec in records:
        assert rec["reward"] in (0.0, 1.0)
        assert rec["response"]["output"] and rec["response"]["usage"]["output_tokens"] >= 1
        assert rec["response"]["model"] == str(model_dir)


def test_unknown_policy_is_a_plain_error(tmp_path, boxed_env):
    tasks = write_rows(tmp_path / "tasks.jsonl", [arithmetic_row(1, 1)])
    config = CollectConfig(
        tasks, tmp_path / "r.jsonl", [boxed_env[0]], policy=str(tmp_path / "missing"), progress=False
    )
    with pytest.raises(CollectError, match=r"--policy .*missing"):
        collect(config)
