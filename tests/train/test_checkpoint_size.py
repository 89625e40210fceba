"""What a checkpoint costs on disk: the tokenizer once per run directory (each step links to it), and
a LoRA step as large as its adapter plus its AdamW state, no more."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from gym_bridge.train.bookkeeping.checkpoint import CheckpointManager  # noqa: E402
from gym_bridge.train.config import LoRAConfig  # noqa: E402
from gym_bridge.train.learner.lora import apply_lora, load_adapter, parameter_counts  # noqa: E402


class CountingTokenizer:
    """Writes a 1 MB vocabulary file and counts how often it is asked to."""

    def __init__(self) -> None:
        self.saves = 0

    def save_pretrained(self, path: Path) -> None:
        self.saves += 1
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "tokenizer.json").write_bytes(b"t" * 2**20)


def llama(hidden: int = 64, layers: int = 2) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def lora_model(rank: int) -> tuple[Any, Any, Any]:
    model = llama()
    peft_model = apply_lora(model, LoRAConfig(enabled=True, match_all_linear=True, dim=rank, alpha=2 * rank))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return model, peft_model, optimizer


def train_one_step(model: Any, optimizer: Any) -> None:
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def save(manager: CheckpointManager, step: int, model: Any, peft_model: Any, optimizer: Any, tokenizer: Any) -> Any:
    return manager.save(
        step,
        model=model,
        tokenizer=tokenizer,
        optimizer=optimizer,
        scheduler=None,
        data_state={},
        config_yaml="grpo: {}\n",
        peft_model=peft_model,
    )


def disk_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root``, not following links (what ``du`` counts)."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if not path.is_symlink():
                total += path.stat().st_size
    return total


def test_the_tokenizer_is_written_once_per_run_and_every_step_reads_it(tmp_path: Path) -> None:
    model, peft_model, optimizer = lora_model(4)
    tokenizer = CountingTokenizer()
    manager = CheckpointManager(tmp_path / "ckpt", keep_top_k=2)
    for step in (1, 2, 3):
        train_one_step(model, optimizer)
        save(manager, step, model, peft_model, optimizer, tokenizer)
    assert tokenizer.saves == 1
    steps = manager.checkpoints()
    assert [c.step for c in steps] == [2, 3]  # pruning removed step 1's link, not the run's tokenizer
    for checkpoint in steps:
        link = checkpoint.path / "policy" / "tokenizer"
        assert link.is_symlink() and link.resolve() == (tmp_path / "ckpt" / "tokenizer").resolve()
        assert (checkpoint.tokenizer_dir / "tokenizer.json").stat().st_size == 2**20
        assert disk_bytes(checkpoint.path) < 2**20  # no tokenizer copy inside the step
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith((".tmp-", ".trash-"))]

    # a new process (a resumed run) writes it once more, replacing the old one atomically
    again = CountingTokenizer()
    save(CheckpointManager(tmp_path / "ckpt", keep_top_k=2), 4, model, peft_model, optimizer, again)
    assert again.saves == 1
    assert (manager.latest().tokenizer_dir / "tokenizer.json").is_file()


def test_a_lora_checkpoint_restores_adapter_and_optimizer_exactly(tmp_path: Path) -> None:
    model, peft_model, optimizer = lora_model(4)
    for _ in range(2):
        train_one_step(model, optimizer)
    checkpoint = save(CheckpointManager(tmp_path), 2, model, peft_model, optimizer, CountingTokenizer())

    fresh, fresh_peft, fresh_optimizer = lora_model(4)
    load_adapter(fresh_peft, checkpoint.adapter_dir)
    checkpoint.load_training_state(fresh_optimizer, None)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for name, parameter in fresh.named_parameters():
        if parameter.requires_grad:
            assert torch.equal(parameter, trained[name]), name
    state, fresh_state = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert state.keys() == fresh_state.keys()
    for key in state:
        assert torch.equal(state[key]["exp_avg"], fresh_state[key]["exp_avg"])
        assert torch.equal(state[key]["exp_avg_sq"], fresh_state[key]["exp_avg_sq"])
    # the next step is the same step
    train_one_step(model, optimizer)
    train_one_step(fresh, fresh_optimizer)
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("rank", [8, 16])
def test_a_lora_step_is_its_adapter_plus_adamw_state(tmp_path: Path, rank: int) -> None:
    """fp32 adapter (4 bytes a parameter) + AdamW's two moments (8 bytes a parameter) and small files:
    the size the README's rank-16 vs rank-8 figures are computed from (SmolLM2-135M: 4.88M adapter
    parameters at rank 16 -> 19.5 + 39.1 MB; rank 8 -> 2.44M -> 9.8 + 19.5 MB)."""
    model, peft_model, optimizer = lora_model(rank)
    train_one_step(model, optimizer)
    checkpoint = save(CheckpointManager(tmp_path), 1, model, peft_model, optimizer, CountingTokenizer())
    trainable, _ = parameter_counts(model)
    adapter = disk_bytes(checkpoint.adapter_dir)
    optimizer_file = (checkpoint.path / "policy" / "optimizer.pt").stat().st_size
    assert 4 * trainable <= adapter <= 4 * trainable + 64 * 1024
    assert 8 * trainable <= optimizer_file <= 8 * trainable + 64 * 1024
    assert disk_bytes(checkpoint.path) <= 12 * trainable + 256 * 1024
