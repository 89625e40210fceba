"""The run configuration's sections other than ``policy``, the whole :class:`MasterConfig` and its
cross-section checks. Every field is documented with an attribute docstring."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gym_bridge.train.config.advantages import AdvEstimatorConfig, check_weights, reward_weight_problems
from gym_bridge.train.config.base import Section
from gym_bridge.train.config.data import DataConfig
from gym_bridge.train.config.loss import ClippedPGLossConfig
from gym_bridge.train.config.policy import PolicyConfig

# ----------------------------------------------------------------------------------------------
# grpo
# ----------------------------------------------------------------------------------------------


class AsyncGRPOConfig(Section):
    """Overlap rollouts with training (NeMo RL's ``grpo.async_grpo``): step s+1's completions are
    sampled while step s trains, from a copy of the policy refit after every step."""

    enabled: bool = False
    """Sample the next steps' rollouts while the current one trains. Pair it with
    ``loss_fn.use_importance_sampling_correction: true``. Default false."""

    rollout_process: bool = True
    """gym-bridge: sample in a child process (a policy copy, the policy server, the built-in
    environments and the agent loop), so sampling and training use separate cores instead of sharing
    one interpreter. false keeps everything in the trainer's process. A policy on CUDA samples in the
    trainer's process whatever this says (its copy on the same GPU). Default true."""

    max_trajectory_age_steps: int = Field(1, ge=1)
    """Step s trains on completions sampled by the policy of step s-1-age (exactly that one, so a
    seeded run is reproducible); this many steps' rollouts run ahead of training. Default 1."""


class RewardShapingConfig(Section):
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13; NeMo RL's ``grpo.reward_shaping``)."""

    enabled: bool = False
    """Add the length penalty to each training reward before advantages (dynamic sampling and the
    logged rewards still use the environment's reward). Default false."""

    overlong_buffer_length: int | None = Field(None, ge=1)
    """L_cache: responses longer than ``max_response_length - overlong_buffer_length`` generated tokens
    are penalised ``overlong_buffer_penalty * (length - (max_response_length - L_cache)) / L_cache``,
    rising linearly to the full penalty at max_response_length (and capped there). Required when
    enabled. Default null."""

    overlong_buffer_penalty: float = Field(1.0, ge=0.0)
    """The penalty at max_response_length (DAPO's 1). Default 1."""

    max_response_length: int | None = Field(None, ge=1)
    """L_max, in generated tokens (all turns' generated tokens of a multi-turn rollout); null means
    policy.generation.max_new_tokens. Default null."""

    @model_validator(mode="after")
    def _buffer_set(self) -> RewardShapingConfig:
        if self.enabled and self.overlong_buffer_length is None:
            raise ValueError("grpo.reward_shaping.enabled needs grpo.reward_shaping.overlong_buffer_length")
        return self


class GRPOConfig(Section):
    """Algorithm settings (NeMo RL's ``grpo:`` section)."""

    mode: Literal["online", "offline"] = "online"
    """``online``: each step samples ``num_generations_per_prompt`` completions per prompt from the
    current policy and scores them in ``env``. ``offline``: no generation; scored rollouts come from
    ``data.train`` (ResponseDataset JSONL with input, output and reward keys), grouped by input."""

    num_prompts_per_step: int = Field(32, ge=1)
    """Distinct prompts per step (P). Default 32."""

    num_generations_per_prompt: int = Field(16, ge=1)
    """Completions sampled per prompt (G, the group size); a step trains on P x G samples. Default 16."""

    max_num_steps: int = Field(1_000_000, ge=1)
    """Stop after this many steps. Default 1000000."""

    max_num_epochs: int = Field(1, ge=1)
    """Stop after this many passes over the training prompts. Default 1."""

    max_rollout_turns: int = Field(1, ge=1)
    """Model turns per rollout in multi-turn environments (1 for single-answer tasks). Default 1."""

    max_failed_rollouts_fraction: float = Field(0.5, ge=0.0, le=1.0)
    """Stop the run when more than this share of a generation batch's rollouts fail (an environment or
    the policy server unreachable or erroring after retries, a record without token ids) or are masked
    by the environment (``mask_sample: true``, e.g. a judge down: kind ``verify/judge_error (masked)``);
    the error names the kinds, their counts and an example. Failed rollouts below it are dropped from the
    batch and counted in ``rollout_failures``, masked ones stay out of the loss and are counted in
    ``rollouts_masked``. A batch where every rollout failed or was masked always stops the run;
    0 stops it at the first failure (NeMo RL has no such key: its Gym path stops when rollouts are
    missing). Applies to validation batches too. Default 0.5."""

    rollout_timeout_s: float | None = Field(None, gt=0.0)
    """Deadline for one rollout, start to verified record: session set-up, every model call, every tool
    call, /verify, their retries and waits (NeMo RL's name; its key bounds a prompt group). A rollout
    past it is cut off and counted in ``rollouts_timed_out`` (the step line's ``timed_out k/n``), and
    ``on_rollout_timeout`` decides what its group becomes; so one request that never returns costs a
    step this, not ``env.<name>.timeout_s`` times its attempts. Null: automatic, from the run's own
    rollouts: ``rollout_timeout_factor`` x the slowest rollout of the previous generation batch (of
    those that needed no retry after a request timeout), at least ``rollout_timeout_min_s``; the first
    batch (nothing measured yet) gets no rollout deadline, only the per-request ones. Set it to bound
    the first batch too, or where rollouts' lengths vary more than 10x between batches. Logged per
    step: ``rollout_deadline_s`` and ``rollout_slowest_s``. Default null."""

    rollout_timeout_factor: float = Field(10.0, ge=1.0)
    """Automatic deadline (``rollout_timeout_s`` null): this many times the slowest rollout of the previous
    generation batch, so only a rollout far slower than any recent one (a hang, not a long answer) is
    cut off. Default 10."""

    rollout_timeout_min_s: float = Field(5.0, gt=0.0)
    """Automatic deadline's floor in seconds, so a pause of the machine (a checkpoint written beside
    async rollouts) does not cut off fast rollouts. Default 5."""

    on_rollout_timeout: Literal["drop_group", "zero_reward"] = "drop_group"
    """What a prompt group with a timed-out rollout becomes. ``drop_group``: the whole group leaves the
    batch (``groups_dropped_for_timeout``; the timed-out rollout counts in ``rollout_failures``), since a
    group baseline without its slowest member is biased and a hang caused by the environment says
    nothing about the answer. ``zero_reward``: the timed-out rollout stays in its group scored 0 (its
    reward components too), trained on the tokens it generated before the deadline; for hangs the policy
    causes (code that never ends); one cut off before its first model answer has no tokens and is
    dropped as a failure. Default drop_group."""

    normalize_rewards: bool = True
    """Divide advantages by the group's reward std (groups with zero std are left unscaled); false is
    Dr. GRPO's unscaled advantage. The ``grpo`` estimator's setting (see adv_estimator.name). Default true."""

    use_leave_one_out_baseline: bool = True
    """Baseline each sample by the mean reward of the *other* samples of its prompt (RLOO) instead of
    the group mean. The ``grpo`` estimator's setting (see adv_estimator.name). Default true."""

    advantage_clip_low: float | None = None
    """Lower bound for advantages after normalisation; null disables. Default null."""

    advantage_clip_high: float | None = None
    """Upper bound for advantages after normalisation; null disables. Default null."""

    val_period: int = Field(10, ge=0)
    """Validate every this many steps; 0 disables periodic validation. Default 10."""

    val_at_start: bool = False
    """Validate once before the first step. Default false."""

    val_at_end: bool = False
    """Validate after the last step. Default false."""

    max_val_samples: int | None = Field(256, ge=1)
    """At most this many validation prompts per validation; null uses all. Default 256."""

    val_batch_size: int | None = Field(256, ge=1)
    """Validation prompts generated per batch; null means all at once. Default 256."""

    val_ranked_data_path: str | None = None
    """A ranked groups file (``{prompt, group: [{response, rank}]}``, what ``transform ranked`` writes):
    each validation also scores the policy on its first ``max_val_samples`` groups as ``gym-bridge eval
    ranked`` does, logging ``ranked/pairwise_accuracy``, ``ranked/top1_accuracy`` and
    ``ranked/kendall_tau`` beside ``accuracy``. Needs no validation prompts. Default null."""

    seed: int = 42
    """Seed for python, torch and the data order. Default 42."""

    overlong_filtering: bool = False
    """Drop from the loss samples that hit the length limit without finishing (truncated). Default false."""

    use_dynamic_sampling: bool = False
    """DAPO dynamic sampling: discard prompt groups whose rewards are all equal and keep generating
    until P informative groups are collected. Logged per step: ``generation_batches``,
    ``generated_reward_mean`` (every sample generated; ``reward_mean`` is over the kept groups only) and
    ``informative_group_fraction``. A step that keeps no group skips its update and still counts
    (schedule, validation, checkpoint). Default false."""

    dynamic_sampling_max_gen_batches: int = Field(10, ge=1)
    """With dynamic sampling, give up after generating this many batches in one step. Default 10."""

    batch_multiplier: float = Field(1.0, ge=1.0)
    """With dynamic sampling, generate ``num_prompts_per_step * batch_multiplier`` prompts per batch. Default 1."""

    async_grpo: AsyncGRPOConfig = Field(default_factory=AsyncGRPOConfig)
    """Asynchronous GRPO (rollouts overlap training)."""

    adv_estimator: AdvEstimatorConfig = Field(default_factory=AdvEstimatorConfig)
    """Advantage estimator: group-relative GRPO, REINFORCE++ or GDPO (several reward components)."""

    reward_weights: dict[str, float] | None = None
    """Train on the verifier's ``reward_components`` weighted by name: ``{correct: 1.0, format: 0.2}``.
    With the grpo and reinforce_plus_plus estimators the training reward is ``sum weight * score``
    (the logged ``reward_mean`` stays the verifier's reward); with gdpo these are the weights of the
    normalised components. Every component a rollout returns must have a weight (0 ignores it); a
    component a whole prompt group lacks counts 0 there, one that only some rollouts of a group carry
    is an error naming it. Null: the verifier's scalar reward. Default null."""

    reward_shaping: RewardShapingConfig = Field(default_factory=RewardShapingConfig)
    """DAPO's overlong reward shaping."""

    @property
    def samples_per_step(self) -> int:
        """``num_prompts_per_step x num_generations_per_prompt``: the completions an online step trains on."""
        return self.num_prompts_per_step * self.num_generations_per_prompt

    @model_validator(mode="after")
    def _estimator_consistent(self) -> GRPOConfig:
        estimator = self.adv_estimator
        check_weights(self.reward_weights, "grpo.reward_weights")
        problems = reward_weight_problems(self.reward_weights, estimator, self.reward_shaping.enabled)
        if problems:
            raise ValueError("\n".join(problems))
        for key in ("normalize_rewards", "use_leave_one_out_baseline"):
            copy = getattr(estimator, key)
            if copy is not None and copy != getattr(self, key):
                raise ValueError(
                    f"grpo.adv_estimator.{key} ({copy}) contradicts grpo.{key} ({getattr(self, key)}); "
                    "set one of them"
                )
        return self

    @model_validator(mode="after")
    def _clip_bounds_ordered(self) -> GRPOConfig:
        lo, hi = self.advantage_clip_low, self.advantage_clip_high
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(
                f"grpo.advantage_clip_low ({lo}) must not exceed grpo.advantage_clip_high ({hi})"
            )
        return self


# ----------------------------------------------------------------------------------------------
# env, checkpointing, logger, cluster
# ----------------------------------------------------------------------------------------------


class EnvConfig(Section):
    """One scoring environment: a built-in resources server or the URL of a running one."""

    server: str | None = None
    """Built-in resources server to start (e.g. math); null with no url means the env's own name.
    Default null."""

    url: str | None = None
    """Base URL of a running NeMo Gym-compatible resources server; the trainer then starts nothing.
    Default null."""

    max_steps: int | None = Field(None, ge=1)
    """Most agent steps (model calls) per rollout; null means grpo.max_rollout_turns. Default null."""

    num_workers: int | None = Field(None, ge=1)
    """Worker pool of the built-in server (math: verifier processes; code: sandboxes at once); refused
    for a url or a server without a pool. Null keeps the server's own (one per CPU core). Default null."""

    timeout_s: float = Field(60.0, gt=0.0)
    """Seconds one attempt of a request to this environment (session set-up, tool call, /verify) may
    take; three attempts, then the rollout fails. Default 60."""

    config: dict[str, Any] = Field(default_factory=dict)
    """Settings passed to the built-in server. Default {}."""

    api_key: str | None = None
    """Bearer token sent to a running server at ``url`` that was started with ``--token`` (every request:
    session set-up, tools, /verify); refused without a url (built-in servers need none). Default null."""

    replicas: int = Field(0, ge=0)
    """Copies of the built-in server run as Ray actors (the cluster at ``cluster.ray_address``, else a
    private Ray on 127.0.0.1), each its own process listening on its node's address with a token made
    for the run, each reserving ``num_workers`` CPUs (1 when unset). The agent loop opens each
    rollout's session on the replica with the fewest open sessions and sends every request of that
    session (seed_session, tool calls, /verify) there. A replica that stops answering gets no new
    sessions (those in flight on it fail and count against ``grpo.max_failed_rollouts_fraction``);
    with none left every rollout fails and the run stops naming it. 0 serves the env in the trainer's
    process. Refused with a url. Default 0."""

    placement_strategy: Literal["SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK"] = "SPREAD"
    """Ray placement-group strategy of the replicas: SPREAD over the nodes where it can, PACK onto as
    few as fit, STRICT_* or an error after ``cluster.placement_timeout_s``. Refused without
    ``replicas``. Default SPREAD."""

    user_model_url: str | None = None
    """The LLM user of this env's multi-turn rows (those with ``user_instructions``, ``customer_scenario``
    or a ``user_script``; :mod:`gym_bridge.rollout.user_sim`): an OpenAI-compatible base URL, or ``policy`` for
    the embedded policy server. Null: rows with a ``user_script`` get a scripted user. Default null."""

    user_params: dict[str, Any] = Field(default_factory=dict)
    """The LLM user's ``responses_create_params`` (``model``, ``temperature``, ``max_output_tokens``, ...;
    NeMo Gym's ``user_responses_create_params``), not the policy's sampling settings. Default {}."""

    max_user_turns: int = Field(8, ge=0)
    """Most user messages after the task prompt in one conversation (a ``user_script``'s ``max_turns``
    can lower it). Default 8."""

    max_conversation_tokens: int | None = Field(None, ge=1)
    """End a conversation once the policy's last call used this many tokens (input + output); null: no
    cap. Default null."""

    @model_validator(mode="after")
    def _one_source(self) -> EnvConfig:
        if self.server is not None and self.url is not None:
            raise ValueError("set either server or url, not both")
        if self.api_key is not None and self.url is None:
            raise ValueError("api_key is sent to a running server: set url (built-in servers need no token)")
        if self.replicas and self.url is not None:
            raise ValueError("replicas start copies of a built-in server: unset url (or replicas)")
        if self.placement_strategy != "SPREAD" and not self.replicas:  # (the saved config holds the default)
            raise ValueError("placement_strategy places the env's Ray replicas: set replicas >= 1")
        url = self.user_model_url
        if url is not None and url != "policy" and not url.startswith(("http://", "https://")):
            raise ValueError(f"user_model_url must be 'policy' or an http(s) URL, not {url!r}")
        return self


class CheckpointingConfig(Section):
    """When and where checkpoints are written."""

    enabled: bool = True
    """Write checkpoints. Default true."""

    checkpoint_dir: str = "results/grpo"
    """Directory of ``step_<n>`` checkpoints; a run resumes from the latest one. Default results/grpo."""

    save_period: int = Field(10, ge=1)
    """Save every this many steps (and at the end). Default 10."""

    keep_top_k: int | None = Field(3, ge=1)
    """Keep the k best checkpoints by metric_name (the latest is always kept); null keeps all. Default 3."""

    metric_name: str | None = "val:accuracy"
    """Metric ranking checkpoints, ``val:<name>`` or ``train:<name>``; null ranks by recency.
    Default val:accuracy."""

    higher_is_better: bool = True
    """Whether a larger metric_name is better. Default true."""

    save_merged: bool = False
    """gym-bridge, with LoRA: also write the merged model (base + adapter, a plain transformers
    model, loadable by vLLM) to ``step_<n>/policy/merged/`` in every checkpoint. Refused without
    LoRA (full fine-tuning checkpoints are whole models already). Default false."""

    @field_validator("metric_name")
    @classmethod
    def _prefixed(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(val|train):\S+", value):
            raise ValueError(f"expects 'val:<metric>' or 'train:<metric>', got {value!r}")
        return value


class WandbConfig(Section):
    """Weights & Biases run naming."""

    project: str = "grpo-dev"
    """W&B project. Default grpo-dev."""

    name: str = "grpo-dev-logger"
    """W&B run name. Default grpo-dev-logger."""


class LoggerConfig(Section):
    """Where metrics go."""

    log_dir: str = "logs"
    """Directory for logs and metrics. Default logs."""

    tensorboard_enabled: bool = False
    """Write TensorBoard event files under log_dir. Default false."""

    wandb_enabled: bool = False
    """Log every record to Weights & Biases (the ``[wandb]`` extra; refused at start-up without it;
    ``WANDB_MODE=offline`` needs no network). Default false."""

    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """W&B settings."""

    monitor_gpus: bool = False
    """Add each GPU's utilisation and memory to every train record (NVML, the ``[gpu]`` extra);
    refused at start-up where no NVIDIA GPU is visible. Default false."""

    num_val_samples_to_print: int = Field(0, ge=0)
    """Validation samples printed to the terminal after each validation. Default 0."""

    print_every_steps: int = Field(1, ge=1)
    """Print a metrics line every this many steps. Default 1."""

    num_rollout_groups_to_log: int = Field(2, ge=0)
    """Whole GRPO groups of each step written to ``<log_dir>/rollouts/step_NNNNNN.jsonl`` (rollout
    records with their advantages) for ``gym-bridge view <log_dir>``; 0 turns it off. Default 2."""


class ClusterConfig(Section):
    """Hardware. The trainer runs on one node (GPUs optional); its policy updates can be spread over
    data-parallel workers on Ray, on this node or across ``num_nodes``."""

    gpus_per_node: int = Field(0, ge=0)
    """GPUs of this node: with policy.device auto, > 0 trains the policy on CUDA (and the vllm backend
    generates there); refused at start-up when torch sees fewer or no CUDA at all; 0 runs on CPU.
    Default 0."""

    num_nodes: int = Field(1, ge=1)
    """Nodes the data-parallel training workers span. 1: one node (a private Ray on 127.0.0.1, or one
    node of the cluster at ``ray_address``). More: the Ray cluster at ``ray_address`` (else
    ``RAY_ADDRESS``, else the local ``ray start`` head), ``train_workers_per_node`` workers on each of
    ``num_nodes`` distinct nodes (one placement group, a bundle per node, STRICT_SPREAD); needs
    ``train_workers_per_node`` >= 1. Default 1."""

    ray_address: str | None = None
    """An existing Ray cluster to run on (``HEAD_IP:6379`` as ``ray start --head`` prints it, or
    ``auto``); unset: ``RAY_ADDRESS`` if set, else a private Ray on 127.0.0.1. The training workers,
    the ray generation replicas and the ``env.<name>.replicas`` are placed there with placement
    groups; the trainer (this process) must run on a node of that cluster. Default unset."""

    placement_timeout_s: float = Field(60.0, gt=0)
    """Seconds to wait for Ray to place the training workers (generation and env replicas) before the
    run stops with an error naming the cluster keys: too few nodes, CPUs or GPUs fail fast instead
    of hanging. Default 60."""

    train_workers_per_node: int = Field(0, ge=0)
    """Data-parallel training workers per node (Ray actors, each with a policy replica, one CPU or with
    ``gpus_per_node`` > 0 one GPU each): every optimizer step's micro-batches are split over the
    ``num_nodes x train_workers_per_node`` workers and their gradients all-reduced (gloo on CPU, NCCL
    on GPU), one optimizer step per global batch, the same update as in one process. 0 updates in
    the trainer's process. Default 0."""


# ----------------------------------------------------------------------------------------------
# the whole config
# ----------------------------------------------------------------------------------------------


class MasterConfig(Section):
    """A whole GRPO run. Construct directly, or with :func:`load_config` from YAML."""

    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    """Algorithm settings."""

    loss_fn: ClippedPGLossConfig = Field(default_factory=ClippedPGLossConfig)
    """Loss settings."""

    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """Model, optimizer and generation settings."""

    data: DataConfig = Field(default_factory=DataConfig)
    """Datasets."""

    env: dict[str, EnvConfig] = Field(default_factory=dict)
    """Scoring environments by name; datasets pick one with env_name."""

    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    """Checkpoint settings."""

    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    """Logging settings."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Hardware settings."""

    @model_validator(mode="after")
    def _consistent(self) -> MasterConfig:
        problems = _cross_section_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        # Resolve "null means <other key>" defaults so the saved config is explicit.
        if self.policy.tokenizer.name is None:
            self.policy.tokenizer.name = self.policy.model_name
        if self.data.max_input_seq_length is None:
            self.data.max_input_seq_length = self.policy.max_total_sequence_length
        for name, env in self.env.items():
            if env.server is None and env.url is None:
                env.server = name
        shaping = self.grpo.reward_shaping
        if shaping.max_response_length is None:
            shaping.max_response_length = self.policy.generation.max_new_tokens
        if self.loss_fn.loss_type == "dr_grpo":  # Dr. GRPO: no std normalisation
            self.grpo.normalize_rewards = False
        return self


def _cross_section_problems(cfg: MasterConfig) -> list[str]:
    grpo, policy = cfg.grpo, cfg.policy
    problems = []
    samples = grpo.samples_per_step
    if grpo.mode == "online" and samples % policy.train_global_batch_size:
        problems.append(
            f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt ({samples}) must be a multiple "
            f"of policy.train_global_batch_size ({policy.train_global_batch_size})"
        )
    packed = policy.dynamic_batching.enabled or policy.sequence_packing.enabled
    if not packed and policy.train_global_batch_size % policy.train_micro_batch_size:
        problems.append(
            f"policy.train_global_batch_size ({policy.train_global_batch_size}) must be a multiple of "
            f"policy.train_micro_batch_size ({policy.train_micro_batch_size})"
        )
    if policy.dynamic_batching.enabled and policy.sequence_packing.enabled:
        problems.append("policy.dynamic_batching.enabled and policy.sequence_packing.enabled are exclusive")
    if policy.generation.max_new_tokens > policy.max_total_sequence_length:
        problems.append(
            f"policy.generation.max_new_tokens ({policy.generation.max_new_tokens}) must not exceed "
            f"policy.max_total_sequence_length ({policy.max_total_sequence_length})"
        )
    cluster = cfg.cluster
    if cluster.num_nodes > 1 and cluster.train_workers_per_node < 1:
        problems.append(
            f"cluster.num_nodes is {cluster.num_nodes}: only data-parallel training workers span nodes; "
            "set cluster.train_workers_per_node >= 1 (or cluster.num_nodes: 1)"
        )
    on_ray = cluster.train_workers_per_node > 0 or policy.generation.backend == "ray"
    if cluster.ray_address and not on_ray and not any(env.replicas for env in cfg.env.values()):
        problems.append(
            f"cluster.ray_address is {cluster.ray_address!r} but nothing runs on Ray: set "
            "cluster.train_workers_per_node >= 1, policy.generation.backend: ray or env.<name>.replicas >= 1 "
            "(or unset cluster.ray_address)"
        )
    if cluster.gpus_per_node and cluster.train_workers_per_node > cluster.gpus_per_node:
        problems.append(
            f"cluster.train_workers_per_node ({cluster.train_workers_per_node}) must not exceed "
            f"cluster.gpus_per_node ({cluster.gpus_per_node}): each GPU worker takes one GPU"
        )
    if policy.generation.backend == "vllm" and cfg.cluster.gpus_per_node < 1:
        problems.append("policy.generation.backend 'vllm' needs a GPU: set cluster.gpus_per_node >= 1")
    for name, env in cfg.env.items():
        if env.url is not None and env.num_workers is not None:
            problems.append(
                f"env.{name}.num_workers sizes a built-in server's worker pool; the server at "
                f"env.{name}.url runs its own"
            )
    if cfg.checkpointing.save_merged and not policy.dtensor_cfg.lora_cfg.enabled:
        problems.append(
            "checkpointing.save_merged merges a LoRA adapter into its base model: it needs "
            "policy.dtensor_cfg.lora_cfg.enabled (full fine-tuning checkpoints are whole models already)"
        )
    if (
        cfg.loss_fn.loss_type == "dr_grpo"
        and "normalize_rewards" in grpo.model_fields_set
        and grpo.normalize_rewards
    ):
        problems.append(
            "grpo.normalize_rewards=true contradicts loss_fn.loss_type='dr_grpo', which needs "
            "grpo.normalize_rewards=false (Dr. GRPO does not divide advantages by the group's std)"
        )
    shaping = grpo.reward_shaping
    limit = shaping.max_response_length or policy.generation.max_new_tokens
    if (
        shaping.enabled
        and shaping.overlong_buffer_length is not None
        and shaping.overlong_buffer_length > limit
    ):
        problems.append(
            f"grpo.reward_shaping.overlong_buffer_length ({shaping.overlong_buffer_length}) must not exceed "
            f"grpo.reward_shaping.max_response_length ({limit})"
        )
    if grpo.async_grpo.enabled and grpo.mode != "online":
        problems.append("grpo.async_grpo.enabled needs grpo.mode 'online' (offline steps generate nothing)")
    if cfg.data.use_multiple_dataloader:
        per = cfg.data.num_prompts_per_dataloader
        if per is None:
            problems.append("data.use_multiple_dataloader needs data.num_prompts_per_dataloader")
        elif grpo.num_prompts_per_step % per:
            problems.append(
                f"grpo.num_prompts_per_step ({grpo.num_prompts_per_step}) must be a multiple of "
                f"data.num_prompts_per_dataloader ({per})"
            )
    for which in ("train", "validation"):
        for i, dataset in enumerate(cfg.data.resolved(which)):
            where = f"data.{which}[{i}]"
            known = ", ".join(sorted(cfg.env)) or "none configured"
            scored_online = grpo.mode == "online" or which == "validation"
            if scored_online and dataset.env_name is None:
                problems.append(
                    f"{where}.env_name is not set (set it or data.default.env_name; envs: {known})"
                )
            elif scored_online and dataset.env_name not in cfg.env:
                problems.append(f"{where}.env_name {dataset.env_name!r} is not an env entry (envs: {known})")
            if grpo.mode == "offline" and which == "train" and dataset.data_path is None:
                problems.append(f"{where}.data_path is required in offline mode (scored rollouts JSONL)")
    return problems


# ----------------------------------------------------------------------------------------------
# YAML loading, overrides, interpolation and error messages
# ----------------------------------------------------------------------------------------------
