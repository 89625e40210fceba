"""Step time, tokens/s and reward of the tiny GRPO recipe, against TRL's GRPOTrainer on the same job.

Both trainers get the same warm-started tiny Llama (``gym_bridge.models.tiny``), the same arithmetic
prompts (``recipes/data/arith_train.jsonl``), 8 prompts x 8 completions x at most 16 new tokens per
step, temperature 1.0, the recipe's learning rate with a 3-step warm-up, no KL term, fp32 on CPU.
gym-bridge runs the full online path (embedded policy server, math resources server, agent loop over
loopback HTTP); TRL generates with ``model.generate`` in-process and scores with a Python function
(the same boxed-answer check as the math server's fast path). TRL's CPU pitfalls are avoided: bf16 off,
gradient checkpointing off, ``per_device_train_batch_size`` = 64 completions, ``loss_type="dapo"``
(a global token mean, like NeMo RL's ``token_level_loss``).

gym-bridge runs twice: synchronous GRPO (``ours``) and async GRPO (``ours-async``: the next step's
rollouts are sampled in a child process while the current step trains, one step off-policy, with the
importance-sampling correction on), each against TRL in the same run.

Each engine runs in its own child process, alternating (ours, async, TRL, ours, ...), because step
times on a shared 2-core machine drift; medians skip each run's first two steps (warm-up). Repeat k
uses seed 42 + k for both engines, so the reward comparison averages over a few sampling seeds. Both
engines run with 1 and with 2 torch threads (``OMP_NUM_THREADS``; gym-bridge's default for tiny
models is 1, TRL's is every core): on a shared 2-core machine 2 threads are faster when it is quiet
and several times slower when another job takes a core.

    .venv/bin/python bench/bench_train.py                 # writes bench/results/train.json
    .venv/bin/python bench/bench_train.py --quick         # one 8-step run per engine and thread count
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
from common import figure, run_trl_timed, trl_answer_dataset, write_results  # noqa: E402  (bench/ helpers, see bench/README.md)

RECIPE = REPO / "recipes" / "grpo_math_tiny.yaml"
WARMUP_STEPS = 2
TRL_REFERENCE = "notes: TRL 1.16 on this machine kind, 0.22-0.26 s/step, ~2,100-2,400 generated tokens/s"


def quiet_run(steps: int, log_dir: Path | str) -> list[str]:
    """Overrides that run the recipe for ``steps`` steps with validation, checkpoints and TensorBoard off."""
    return [
        f"grpo.max_num_steps={steps}",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "grpo.val_at_end=false",
        "checkpointing.enabled=false",
        "logger.tensorboard_enabled=false",
        f"logger.log_dir={log_dir}",
    ]


ASYNC_OVERRIDES = ["grpo.async_grpo.enabled=true", "loss_fn.use_importance_sampling_correction=true"]
SYNC_OVERRIDES = ["grpo.async_grpo.enabled=false"]


def _ours(steps: int, out: Path, seed: int, overrides: list[str]) -> dict[str, Any]:
    """gym-bridge's trainer on the tiny recipe, validation and checkpoints off."""
    from gym_bridge.train.bookkeeping.logging import read_metrics
    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    cfg = load_config(
        RECIPE,
        [*quiet_run(steps, out), f"grpo.seed={seed}", *overrides],
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
                "generation_s": r.get("time_generation_s", 0.0),
                "reward_and_http_s": r.get("time_reward_and_http_s", 0.0),
                "logprobs_s": r.get("time_logprobs_s", 0.0),
                "training_s": r.get("time_training_s", 0.0),
                "waiting_for_rollouts_s": r.get("time_waiting_for_rollouts_s", 0.0),
                "generated_tokens": r["gen_length_mean"] * r["num_samples"],
                "reward": r["reward_mean"],
            }
            for r in rows
        ],
    }


def _trl(steps: int, out: Path, seed: int) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same model, prompts, sizes and learning rate."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym_bridge.integrations.trl import grpo_config_from
    from gym_bridge.models.evaluate import extract_boxed
    from gym_bridge.models.tiny import ensure_tiny
    from gym_bridge.train.config import load_config

    cfg = load_config(RECIPE)
    path = ensure_tiny()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)

    def boxed_reward(completions: list[Any], expected_answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [
            float(extract_boxed(t) == str(e).strip()) for t, e in zip(texts, expected_answer, strict=True)
        ]

    args = grpo_config_from(cfg, out, max_steps=steps, seed=seed, disable_tqdm=True)
    return run_trl_timed(
        args,
        model=model,
        reward_funcs=boxed_reward,
        train_dataset=trl_answer_dataset(REPO / cfg.data.train[0].data_path),
        processing_class=tokenizer,
    )


def run_child(engine: str, steps: int, seed: int, threads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                engine,
                "--steps",
                str(steps),
                "--seed",
                str(seed),
                "--child-out",
                str(result_file),
            ],
            check=True,
            cwd=REPO,  # the recipe's data paths are relative to the repository root
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)},
        )
        return json.loads(result_file.read_text())


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over every run's steps after the warm-up, and rewards of the first and last 5 steps."""
    steps = [s for run in runs for s in run["steps"][WARMUP_STEPS:]]
    median_step = statistics.median(s["step_s"] for s in steps)
    summary: dict[str, Any] = {
        "median_step_s": round(median_step, 4),
        "mean_step_s": round(statistics.mean(s["step_s"] for s in steps), 4),
        "step_s_range": [
            round(min(s["step_s"] for s in steps), 4),
            round(max(s["step_s"] for s in steps), 4),
        ],
        "generated_tokens_per_s": round(
            statistics.median(s["generated_tokens"] / s["step_s"] for s in steps), 1
        ),
        "reward_first_5_steps": round(
            statistics.mean(s["reward"] for run in runs for s in run["steps"][:5]), 4
        ),
        "reward_last_5_steps": round(
            statistics.mean(s["reward"] for run in runs for s in run["steps"][-5:]), 4
        ),
        "wall_s_per_run": [round(run["wall_s"], 1) for run in runs],
    }
    phases = ("generation_s", "reward_and_http_s", "logprobs_s", "training_s", "waiting_for_rollouts_s")
    if all(p in steps[0] for p in phases):
        summary["median_phase_s"] = {
            p.removesuffix("_s"): round(statistics.median(s[p] for s in steps), 4) for p in phases
        }
    return summary


ENGINES = {
    "ours": "gym-bridge, synchronous GRPO",
    "ours-async": "gym-bridge, async GRPO (rollouts in a child process overlap training, trajectories 1 step old)",
    "trl": "TRL GRPOTrainer",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps per run")
    parser.add_argument(
        "--repeats", type=int, default=3, help="alternating runs per engine (seeds 42, 43, ...)"
    )
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, 2], help="torch threads (OMP_NUM_THREADS), every engine"
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=sorted(ENGINES),
        default=list(ENGINES),
        help="engines to run (trl is the baseline)",
    )
    parser.add_argument("--seed", type=int, default=42, help="seed of the first repeat")
    parser.add_argument("--quick", action="store_true", help="one 8-step run per engine and thread count")
    parser.add_argument("--child", choices=sorted(ENGINES), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        run = args.child_out.parent / "run"
        if args.child == "trl":
            result = _trl(args.steps, run, args.seed)
        else:
            result = _ours(
                args.steps, run, args.seed, ASYNC_OVERRIDES if args.child == "ours-async" else SYNC_OVERRIDES
            )
        args.child_out.write_text(json.dumps(result))
        return
    if args.quick:
        args.steps, args.repeats = 8, 1
    if "trl" not in args.engines:
        parser.error("--engines must include trl, the baseline")

    from gym_bridge.models.tiny import ensure_tiny

    ensure_tiny()  # build the cached model once, outside the timed runs
    runs: dict[str, list[dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for threads in args.threads:
            for engine in args.engines:
                print(
                    f"[{repeat + 1}/{args.repeats}] {engine}, {threads} thread(s): {args.steps} steps ...",
                    flush=True,
                )
                runs.setdefault(f"{engine}/{threads}", []).append(
                    run_child(engine, args.steps, args.seed + repeat, threads)
                )
    summaries = {key: summarize(value) for key, value in runs.items()}
    peer = "baseline: TRL GRPOTrainer, same model, prompts, sizes, lr and threads, same run"
    rows = []
    for threads in args.threads:
        trl = summaries[f"trl/{threads}"]
        for engine in [e for e in args.engines if e != "trl"]:
            ours, label = summaries[f"{engine}/{threads}"], f"{engine}, {threads} thread(s)"
            rows += [
                figure(f"GRPO step time, median, {label} (8x8x16 tokens, tiny Llama)", ours["median_step_s"],
                       "s/step", baseline=trl["median_step_s"],
                       note=f"{ENGINES[engine]}; {peer}; lower is better ({TRL_REFERENCE})"),
                figure(f"GRPO step time, mean, {label}", ours["mean_step_s"], "s/step",
                       baseline=trl["mean_step_s"], note=f"{peer}; lower is better; the mean shows load spikes"),
                figure(f"generated tokens/s, median step, {label}", ours["generated_tokens_per_s"], "tok/s",
                       baseline=trl["generated_tokens_per_s"], note=f"{peer}; higher is better"),
                figure(f"mean reward, last 5 of {args.steps} steps, {label}", ours["reward_last_5_steps"],
                       "reward", baseline=trl["reward_last_5_steps"], note=f"{peer}; higher is better; first 5 "
                       f"steps: ours {ours['reward_first_5_steps']}, TRL {trl['reward_first_5_steps']}"),
            ]  # fmt: skip
            for phase, seconds in ours.get("median_phase_s", {}).items():
                rows.append(figure(f"gym-bridge step phase, {label}: {phase}", seconds, "s/step",
                                   note="median per step; no peer"))  # fmt: skip
    write_results(
        "train",
        rows,
        quick=args.quick,
        details={"steps_per_run": args.steps, "repeats": args.repeats, "threads": args.threads,
                 "engines": args.engines, "warmup_steps_skipped": WARMUP_STEPS, "summaries": summaries,
                 "trl_version": _trl_version(), "runs": runs},
    )  # fmt: skip
    print(json.dumps(summaries, indent=2))


def _trl_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
