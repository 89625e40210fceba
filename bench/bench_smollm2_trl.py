"""SmolLM2-135M-Instruct + LoRA: gym-bridge's GRPO step against TRL's ``GRPOTrainer`` with ``peft_config``.

The same job for both (issue 13 item 5): the LoRA recipe's word problems
(``recipes/data/word_train.jsonl``, the same chat prompts with their worked examples), the recipe's
8 prompts x 4 completions of at most 48 new tokens, temperature 0.7, its learning rate, warm-up, LoRA
rank and alpha on every linear projection, no KL term, fp32 on CPU, the same "The answer is N." reward rule
(the math server's ``boxed_or_final`` extraction compared with the expected answer).

gym-bridge runs its full online path (policy server, math resources server, agent loop over loopback
HTTP); TRL generates with ``model.generate`` in-process and scores with a Python function. Each engine
runs in its own child process, alternating (ours, TRL, ours, ...) because step times on a shared 2-core
machine drift; the parent samples the child's process tree RSS every 0.2 s for the peak. Medians skip
each run's first step (warm-up).

    .venv/bin/python bench/bench_smollm2_trl.py                # 2 x 10 steps per engine
    .venv/bin/python bench/bench_smollm2_trl.py --quick        # 1 x 3 steps per engine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import figure, run_trl_timed, tree_rss_bytes, trl_answer_dataset, write_results  # noqa: E402  (bench/ helpers, see bench/README.md)

RECIPE = REPO / "recipes" / "grpo_smollm2_135m_lora.yaml"
WARMUP_STEPS = 1


def _ours(steps: int, out: Path, seed: int) -> dict[str, Any]:
    """gym-bridge's trainer on the LoRA recipe, validation and checkpoints off."""
    from gym_bridge.train.bookkeeping.logging import read_metrics
    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    cfg = load_config(
        RECIPE,
        [
            f"grpo.max_num_steps={steps}",
            f"grpo.seed={seed}",
            "grpo.val_period=0",
            "grpo.val_at_start=false",
            "grpo.val_at_end=false",
            "checkpointing.enabled=false",
            "logger.tensorboard_enabled=false",
            f"logger.log_dir={out}",
        ],
    )
    started = time.perf_counter()
    train(cfg, show_progress=False)
    wall = time.perf_counter() - started
    rows = [r for r in read_metrics(out) if r["split"] == "train"]
    return {
        "wall_s": wall,
        "steps": [
            {
                "step_s": r["time_step_s"],
                "generated_tokens": r["gen_length_mean"] * r["num_samples"],
                "reward": r["reward_mean"],
            }
            for r in rows
        ],
    }


def _trl(steps: int, out: Path, seed: int) -> dict[str, Any]:
    """TRL's GRPOTrainer + peft LoRA on the same model, prompts, sizes, rank and learning rate."""
    import torch
    from peft import LoraConfig

    from gym_bridge.integrations.trl import grpo_config_from
    from gym_bridge.models.registry import load_model_and_tokenizer
    from gym_bridge.train.config import load_config
    from resources_servers.math.extraction import extract_answer

    cfg = load_config(RECIPE)
    model, tokenizer = load_model_and_tokenizer(cfg.policy.model_name, dtype=torch.float32)

    def answer_reward(completions: list[Any], expected_answer: list[str], **_: Any) -> list[float]:
        rewards = []
        for completion, expected in zip(completions, expected_answer, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            found = extract_answer(text, "boxed_or_final")
            rewards.append(float(found is not None and found.answer.strip() == str(expected).strip()))
        return rewards

    lora = cfg.policy.dtensor_cfg.lora_cfg
    args = grpo_config_from(cfg, out, max_steps=steps, seed=seed, disable_tqdm=True)
    return run_trl_timed(
        args,
        model=model,
        reward_funcs=answer_reward,
        train_dataset=trl_answer_dataset(Path(cfg.data.train[0].data_path)),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=lora.dim, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules="all-linear"
        ),
    )


def run_child(engine: str, steps: int, seed: int) -> dict[str, Any]:
    """One engine's run in a fresh process; its result plus the peak RSS of its process tree."""
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(REPO)}
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", engine, "--steps", str(steps), "--seed", str(seed),
             "--out", str(result_file)],
            env=env,
            cwd=REPO,
        )
        peak = 0
        while child.poll() is None:
            peak = max(peak, tree_rss_bytes(child.pid))
            time.sleep(0.2)
        if child.returncode != 0:
            raise RuntimeError(f"{engine} child exited with {child.returncode}")
        result = json.loads(result_file.read_text())
    result["peak_rss_gib"] = peak / 2**30
    result["engine"] = engine
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    steps = [s for run in runs for s in run["steps"][WARMUP_STEPS:]]
    last = [run["steps"][-1]["reward"] for run in runs if run["steps"]]
    return {
        "median_step_s": statistics.median(s["step_s"] for s in steps),
        "tokens_per_s": sum(s["generated_tokens"] for s in steps) / sum(s["step_s"] for s in steps),
        "reward_mean": statistics.fmean(s["reward"] for run in runs for s in run["steps"]),
        "reward_last_step": statistics.fmean(last),
        "peak_rss_gib": max(run["peak_rss_gib"] for run in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one 3-step run per engine")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=42, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            run = (_ours if args.child == "ours" else _trl)(args.steps, Path(tmp), args.seed)
        args.out.write_text(json.dumps(run))
        return
    steps, repeats = (3, 1) if args.quick else (args.steps, args.repeats)
    runs: list[dict[str, Any]] = []
    for k in range(repeats):
        for engine in ("ours", "trl"):
            print(f"[{engine}] repeat {k + 1}/{repeats}, {steps} steps", flush=True)
            runs.append(run_child(engine, steps, 42 + k))
    ours = summarize([r for r in runs if r["engine"] == "ours"])
    trl = summarize([r for r in runs if r["engine"] == "trl"])
    peer = "TRL GRPOTrainer + peft LoRA, same run"
    rows = [
        figure("SmolLM2 LoRA GRPO s/step (median)", ours["median_step_s"], "s/step",
               baseline=trl["median_step_s"], note=f"{peer}; lower is better"),
        figure("SmolLM2 LoRA GRPO step throughput", trl["median_step_s"] / ours["median_step_s"], "x TRL",
               note="TRL's median step time / ours; aim >= 1.5"),
        figure("SmolLM2 LoRA GRPO peak RSS", ours["peak_rss_gib"], "GiB", baseline=trl["peak_rss_gib"],
               note=f"{peer}; whole process tree; aim < 0.2x"),
        figure("SmolLM2 LoRA GRPO mean train reward", ours["reward_mean"], "reward",
               baseline=trl["reward_mean"], note=f"{peer}; over all {steps} steps of each run"),
        figure("SmolLM2 LoRA GRPO generated tokens/s", ours["tokens_per_s"], "tok/s",
               baseline=trl["tokens_per_s"], note=peer),
    ]
    write_results("smollm2_trl", rows, quick=args.quick,
                  details={"ours": ours, "trl": trl, "runs": runs, "steps": steps, "repeats": repeats})
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
