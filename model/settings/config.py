"""The trainer's configuration: typed dataclasses, YAML files and `key=value` overrides.

    python -m model.train --config run.yaml learning_rate=3e-5 model.n_layer=4

Values are read from the YAML file (if any), then overridden left to right by the command line;
nested sections use dotted keys. Every value is converted to the field's type and validated, and an
error names the field, the allowed range and the value. Unknown keys are errors (with a guess at the
key meant), so a typo never silently falls back to a default.

The Intel guides' gpt2_train_cfg.yaml layout (optimizer_config / trainer_config sections) is
accepted too and translated once, on reading the file, by model.settings.intel_layout.

The defaults fine-tune pretrained GPT-2: a small peak learning rate (6e-5, against nanoGPT's
pretraining 6e-4, which makes fine-tuning loss rise), a short warmup and cosine decay.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.conventions import (
    BACKEND_CHOICES,
    DEFAULT_MAX_ITERS,
    DEVICE_CHOICES,
    GRAD_COMPRESSION_CHOICES,
    MIXED_PRECISION_CHOICES,
)
from model.settings.config_values import (
    ConfigError,
    coerce,
    dotted_fields,
    flatten,
    get_dotted,
    parse_overrides,
    read_yaml_file,
)
from model.settings.health_config import HealthConfig
from model.settings.intel_layout import translate_intel_layout
from model.settings.shape_rules import SHAPE_RULES

FINE_TUNE_LR = 6e-5
SCRATCH_LR = 1e-3


@dataclass
class ModelShape:
    """Shape of a model trained from scratch (init_from=scratch); pretrained checkpoints bring their own.

    The defaults are nanoGPT's "baby GPT" (about 10M parameters plus GPT-2's embedding table)."""

    n_layer: int = 6
    """Transformer blocks (scratch only)."""
    n_head: int = 6
    """Attention heads per block; n_embd must be divisible by it (scratch only)."""
    n_embd: int = 384
    """Width of the residual stream (scratch only)."""
    bias: bool = True
    """Biases in Linear layers and LayerNorms (scratch only; GPT-2 checkpoints have them)."""
    dropout: float = 0.0
    """Dropout probability, applied to pretrained and scratch models alike; 0 is usual for fine-tuning."""


MODEL_SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelShape))


@dataclass
class TrainConfig:
    """Everything `python -m model.train` reads. Keys are the YAML keys and the override names."""

    # --- what to train, on what, and where to write -------------------------------------------
    init_from: str = "gpt2"
    """"scratch", a GPT-2 name (gpt2, gpt2-medium, gpt2-large, gpt2-xl; from the Hugging Face hub,
    needs internet or a warm cache) or a local Hugging Face GPT-2 directory. Ignored when out_dir
    holds a valid snapshot.pt: then the run resumes from it."""
    data_dir: str = "data"
    """Directory with train.bin and val.bin (uint16 GPT-2 tokens, written by `python -m model.prepare`)."""
    out_dir: str = "out"
    """Run directory: metrics.jsonl, snapshot.pt (every eval) and ckpt.pt (best val loss)."""
    model: ModelShape = field(default_factory=ModelShape)
    """Model shape for init_from=scratch (dotted keys: model.n_layer=4)."""
    block_size: int = 256
    """Tokens per training sequence; a pretrained model's context is cropped to it. 1..1024 for GPT-2."""

    # --- batch and schedule ----------------------------------------------------------------------
    batch_size: int = 4
    """Sequences per micro-batch on each rank."""
    gradient_accumulation_steps: int = 8
    """Micro-batches per optimizer step on each rank; gradients are all-reduced once per step.
    Tokens per optimizer step = batch_size x block_size x gradient_accumulation_steps x world size."""
    max_iters: int = DEFAULT_MAX_ITERS
    """Optimizer steps to train for (the run ends at this iteration, resumed runs included)."""
    learning_rate: float | None = None
    """Peak learning rate. None: 6e-5 when fine-tuning a pretrained model, 1e-3 from scratch."""
    min_lr: float | None = None
    """Learning rate at the end of the cosine decay. None: learning_rate / 10."""
    warmup_iters: int = 20
    """Steps of linear warmup from 0 to learning_rate."""
    lr_decay_iters: int | None = None
    """Step at which the cosine decay reaches min_lr (held afterwards). None: max_iters."""
    decay_lr: bool = True
    """Warmup + cosine decay; false keeps learning_rate constant."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay, applied to matrices only (not biases, LayerNorms)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""

    # --- evaluation, logging, checkpoints -------------------------------------------------------
    eval_interval: int = 50
    """Evaluate train/val loss (and write snapshot.pt) every this many steps, and at the last step."""
    keep_snapshots: int = 1
    """Snapshots kept in out_dir, the newest (snapshot.pt) included: the older ones are named by their
    iteration (snapshot.iter40.pt, and PowerSGD's side files likewise), and the oldest beyond this is
    deleted once the new one is complete on disk. A resume takes the newest one that is intact, so with
    2 or more a damaged snapshot.pt costs the steps since the one before it instead of the run
    (model.checkpointing.retention). Each kept snapshot takes the disk of one (GPT-2 small: 1.5 GB)."""
    eval_iters: int = 20
    """Batches per split averaged for an evaluation."""
    log_interval: int = 10
    """Print and record loss, lr, step time, tokens/s and MFU every this many steps."""
    eval_only: bool = False
    """Evaluate once and exit without training."""
    peak_flops: float = 0.0
    """Peak FLOP/s of ONE rank, the MFU denominator. 0: on a CPU measure it at start with a square
    matmul in the training dtype on this rank's threads (logged), so MFU is relative to what this CPU
    actually sustains; on a GPU the data sheet's dense peak for the training dtype (measured when
    the GPU is not in model.monitoring.mfu's table)."""

    # --- numerics and speed ----------------------------------------------------------------------
    device: str = "auto"
    """auto (the GPU numbered LOCAL_RANK when this rank sees a GPU, else the CPU), cpu or cuda (an
    error when no GPU is visible)."""
    mixed_precision: str = "auto"
    """auto (bf16 autocast where the CPU has amx_bf16 or avx512_bf16 or the GPU supports bf16; fp16
    with a gradient scaler on GPUs without bf16; else fp32), fp32, bf16 or fp16 (GPU only)."""
    compile: bool | None = None
    """torch.compile the model (the first steps are slow while it compiles). None (auto): on a GPU yes,
    on a CPU no (bench/train_step.py weighs it there)."""
    tf32: bool | None = None
    """Let a GPU's fp32 matmuls (all of mixed_precision=fp32, what autocast leaves in fp32) use TF32
    tensor cores. None (auto): on GPUs of capability 8.0 and later, which have them; false: true fp32."""
    cuda_graphs: bool | None = None
    """Replay each compiled step as CUDA graphs (torch.compile's reduce-overhead mode): the GPU runs the
    step's few hundred kernels without a launch each. None (auto): on when one process trains on a GPU
    with the model compiled; off with several processes, whose DDP gradient hooks run between the
    compiled graphs (model.gpt.precision.cuda_graphs_choice). true where it cannot apply is an error."""
    fused_loss: bool = True
    """The output projection and cross-entropy as one fused step that never writes fp32 logits (a
    CPU kernel; a Triton kernel on a CUDA GPU in bf16 or fp32). false: the logits, then
    F.cross_entropy on an fp32 copy (the reference path, and fp16's)."""
    deterministic: bool = False
    """Only kernels that repeat bit for bit, so a stopped and resumed run on a GPU ends with the
    uninterrupted run's weights exactly, compiled or not, as it does on a CPU, where this changes
    nothing (model.gpt.precision.apply_determinism). Off by default: on a GPU it may cost speed
    (bench/gpu_vs_nanogpt.py --diagnose --variants deterministic), and without it a resumed GPU run
    continues the same training within rounding."""
    threads: int = 0
    """torch intra-op threads per rank; 0 leaves torch's default (OMP_NUM_THREADS, else all cores)."""
    seed: int = 1337
    """Seed for initialisation (identical on all ranks) and for batch selection (offset by rank)."""

    # --- distributed -----------------------------------------------------------------------------
    expected_world_size: int | None = None
    """World size the launch planned; a different real world size is an error. None: not checked."""
    backend: str = "auto"
    """Collective backend: auto (nccl on a GPU; on a CPU ccl when oneccl_bindings_for_pytorch imports,
    else gloo), nccl, ccl or gloo."""
    collective_timeout_s: float = 300.0
    """Seconds a collective may wait for a peer before every surviving rank fails with an error."""
    rendezvous_timeout_s: float = 0.0
    """Seconds the ranks wait for each other to join at the start (0: collective_timeout_s). A launcher
    whose ranks may start minutes apart (pods on nodes that a scale-up from zero boots) sets it longer;
    once joined, a collective still waits collective_timeout_s at most. Not under torchrun, whose own
    rendezvous has every node's agent joined before any rank starts."""
    ddp_bucket_cap_mb: float = 25.0
    """DDP gradient bucket size in MB: gradients are all-reduced bucket by bucket while backward runs."""
    grad_compression: str = "auto"
    """What crosses the link for the gradients (model.parallel.comm_hooks): none (fp32 all-reduce), bf16 or
    fp16 (half the bytes, rounded), powersgd (a low-rank approximation with error feedback: 0.74% of
    the bytes for GPT-2 small at rank 4), or auto: time an all-reduce at start and pick by how long the fp32
    gradients would take against the step's compute (docs/training.md#gradient-communication-over-slow-links).
    One process: unused."""
    powersgd_rank: int = 4
    """PowerSGD's matrix approximation rank: bytes sent grow with it, and so does accuracy."""
    powersgd_start_iter: int = 10
    """Optimizer steps of plain all-reduce before PowerSGD starts (torch's start_powerSGD_iter; the
    first steps are the most sensitive to approximate gradients). A resume goes on from the snapshot's
    count (model.checkpointing.compressor_state), or counts again when it cannot restore PowerSGD's state."""
    keep_global_batch: bool = False
    """On a resume with a different world size (fewer or more nodes), set gradient_accumulation_steps
    so that batch_size x gradient_accumulation_steps x world size equals the snapshot's global batch
    (sequences per optimizer step), and log it. false: a resume whose global batch differs from the
    snapshot's is an error. The launcher sets it when it resumes a run on fewer nodes (--min-nodes)."""
    zero_stage: int = 0
    """1: shard AdamW's state over the ranks (ZeRO stage 1, torch's ZeroRedundancyOptimizer; the role
    DeepSpeed ZeRO-1 plays): each rank keeps the moments of about 1/world size of the parameters,
    saving 8 bytes per parameter times (world size - 1)/world size on every rank, for one broadcast
    of the updated parameters per step. Snapshots stay one loadable file (model.parallel.zero). 0: off."""
    stop_grace_s: float = 25.0
    """Seconds a stop signal (SIGTERM/SIGINT) leaves to finish the step in progress and write its
    snapshot before the process stops at once, keeping the previous snapshot. Below the 30 s that
    GCP and Azure give a preempted VM (docs/recovery.md#preemption)."""

    # --- budget (model.monitoring.budget; `fab train --budget` sets these) ------------------------
    budget_usd: float = 0.0
    """Stop the run, with a snapshot of the last completed step and exit status 3 (EXIT_BUDGET),
    before the next snapshot would take its spend past this many US dollars. 0: no budget."""
    budget_usd_per_hour: float = 0.0
    """What the run costs per hour (the launcher's Cluster.run_hourly_cost_usd: a cluster of machines'
    hourly_cost_usd, every node of it; on Kubernetes, whose hourly_cost_usd is one training node's,
    that x the run's pods plus the cluster at rest); spend is this price x the time since
    budget_clock_start. Must be > 0 with a budget."""
    budget_clock_start: float = 0.0
    """Unix time the run's spend is counted from at budget_usd_per_hour: the launch, so restarts and
    the downtime between them count (or the restart that changed the price: a Kubernetes run going on
    with fewer pods). 0: when this trainer started."""
    budget_spent_usd: float = 0.0
    """What the run spent before budget_clock_start (its earlier attempts; after a restart that changed
    the price, also this launch until then), counted against budget_usd."""

    # --- training health (model.monitoring.health) ------------------------------------------------
    health: HealthConfig = field(default_factory=HealthConfig)
    """Per-layer statistics every health.interval steps, and the guard that skips non-finite or
    spiking steps (dotted keys: health.interval=10, health.spike_factor=3)."""

    # ------------------------------------------------------------------------------------------------
    def peak_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return SCRATCH_LR if self.init_from == "scratch" else FINE_TUNE_LR

    def final_learning_rate(self) -> float:
        return self.min_lr if self.min_lr is not None else self.peak_learning_rate() / 10

    def decay_iters(self) -> int:
        return self.lr_decay_iters if self.lr_decay_iters is not None else self.max_iters

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Raise ConfigError naming the first field outside its allowed range."""
        checks: list[tuple[str, bool, str]] = [
            ("block_size", 1 <= self.block_size <= 1_000_000, ">= 1 (<= 1024 for GPT-2 checkpoints)"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("gradient_accumulation_steps", self.gradient_accumulation_steps >= 1, ">= 1"),
            ("max_iters", self.max_iters >= 0, ">= 0"),
            ("learning_rate", self.learning_rate is None or 0 < self.learning_rate < 1, "in (0, 1) or null"),
            (
                "min_lr",
                self.min_lr is None or 0 <= self.min_lr <= self.peak_learning_rate(),
                f"in [0, learning_rate={self.peak_learning_rate():g}] or null",
            ),
            ("warmup_iters", self.warmup_iters >= 0, ">= 0"),
            (
                "lr_decay_iters",
                self.lr_decay_iters is None or self.lr_decay_iters >= self.warmup_iters,
                f">= warmup_iters ({self.warmup_iters}) or null",
            ),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("beta1", 0 <= self.beta1 < 1, "in [0, 1)"),
            ("beta2", 0 <= self.beta2 < 1, "in [0, 1)"),
            ("grad_clip", self.grad_clip >= 0, ">= 0 (0 disables clipping)"),
            ("eval_interval", self.eval_interval >= 1, ">= 1"),
            ("keep_snapshots", self.keep_snapshots >= 1, ">= 1 (1 keeps snapshot.pt alone, as the newest)"),
            ("eval_iters", self.eval_iters >= 1, ">= 1"),
            ("log_interval", self.log_interval >= 1, ">= 1"),
            ("peak_flops", self.peak_flops >= 0, ">= 0 (0 measures it)"),
            ("device", self.device in DEVICE_CHOICES, f"one of {', '.join(DEVICE_CHOICES)}"),
            (
                "mixed_precision",
                self.mixed_precision in MIXED_PRECISION_CHOICES,
                f"one of {', '.join(MIXED_PRECISION_CHOICES)}",
            ),
            (
                "mixed_precision",
                not (self.device == "cpu" and self.mixed_precision == "fp16"),
                "auto, fp32 or bf16 with device=cpu (fp16 needs a GPU)",
            ),
            ("tf32", not (self.tf32 and self.device == "cpu"), "unset (auto) or false with device=cpu (a GPU's TF32)"),
            (
                "cuda_graphs",
                not (self.cuda_graphs and (self.device == "cpu" or self.compile is False)),
                "unset (auto) or false with device=cpu or compile=false (CUDA graphs replay a compiled GPU step)",
            ),
            (
                "cuda_graphs",
                not (self.cuda_graphs and (self.expected_world_size or 1) > 1),
                "unset (auto) or false with several ranks (DDP's gradient hooks run between the graphs)",
            ),
            ("threads", self.threads >= 0, ">= 0 (0 keeps torch's default)"),
            ("seed", 0 <= self.seed < 2**31, "in [0, 2^31)"),
            (
                "expected_world_size",
                self.expected_world_size is None or self.expected_world_size >= 1,
                ">= 1 or null",
            ),
            ("backend", self.backend in BACKEND_CHOICES, f"one of {', '.join(BACKEND_CHOICES)}"),
            ("collective_timeout_s", self.collective_timeout_s > 0, "> 0"),
            ("rendezvous_timeout_s", self.rendezvous_timeout_s >= 0, ">= 0 (0: collective_timeout_s)"),
            ("ddp_bucket_cap_mb", self.ddp_bucket_cap_mb > 0, "> 0"),
            (
                "grad_compression",
                self.grad_compression in GRAD_COMPRESSION_CHOICES,
                f"one of {', '.join(GRAD_COMPRESSION_CHOICES)}",
            ),
            ("powersgd_rank", self.powersgd_rank >= 1, ">= 1"),
            (
                "powersgd_start_iter",
                self.powersgd_start_iter >= 2,
                ">= 2 (PowerSGD's error feedback starts after DDP's first two steps)",
            ),
            ("stop_grace_s", self.stop_grace_s > 0, "> 0"),
            ("budget_usd", self.budget_usd >= 0, ">= 0 (0: no budget)"),
            (
                "budget_usd_per_hour",
                self.budget_usd_per_hour > 0 if self.budget_usd > 0 else self.budget_usd_per_hour >= 0,
                "> 0 with a budget (spend is this price x the time since budget_clock_start)",
            ),
            ("budget_clock_start", self.budget_clock_start >= 0, ">= 0 (Unix seconds; 0: the trainer's start)"),
            ("budget_spent_usd", self.budget_spent_usd >= 0, ">= 0"),
            ("zero_stage", self.zero_stage in (0, 1), "0 (off) or 1 (optimizer state sharded over the ranks)"),
            *self.health.checks(),
            # The shape's constraints are GPTConfig's own (model.settings.shape_rules), worded for our keys.
            *(
                (f"model.{rule.field}", rule.holds(self.model), rule.allowed(self.model, prefix="model."))
                for rule in SHAPE_RULES
                if rule.field in MODEL_SHAPE_FIELDS
            ),
            ("init_from", bool(self.init_from), "scratch, a GPT-2 name or a Hugging Face directory"),
            ("data_dir", bool(self.data_dir), "a directory path"),
            ("out_dir", bool(self.out_dir), "a directory path"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"{name} must be {allowed}, got {get_dotted(self, name)!r}")


# --- loading -------------------------------------------------------------------------------------


Written = dict[str, tuple[str, int | None]]
"""Where each key of a config file was written: dotted key -> (the file, its line or None)."""


def build_config(flat: dict[str, Any], written: Written | None = None) -> TrainConfig:
    """TrainConfig from our keys, dotted (see config_values.flatten); converted and validated. An
    error about a key in `written` names its file and line."""
    written = written or {}
    known = dotted_fields(TrainConfig)
    unknown = [k for k in flat if k not in known]
    if unknown:
        raise ConfigError(unknown_keys_text(unknown, known, written))
    cfg = TrainConfig()
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        target = cfg
        for part in parents:
            target = getattr(target, part)
        try:
            setattr(target, leaf, coerce(key, value, known[key]))
        except ConfigError as e:
            if key not in written:
                raise
            path, line = written[key]
            raise ConfigError(f"{path}{f':{line}' if line else ''}: {e}") from None
    cfg.validate()
    return cfg


def unknown_keys_text(unknown: list[str], known: dict[str, Any], written: Written) -> str:
    """The unknown keys, each with a guess at the key meant; a file's under its name, with their lines."""

    def hint(key: str) -> str:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        return f"{key} (did you mean {close[0]}?)" if close else key

    given = [hint(k) for k in unknown if k not in written]
    in_file = [k for k in unknown if k in written]
    if not in_file:
        return f"unknown config key(s): {', '.join(given)}"
    listed = []
    for key in in_file:
        line = written[key][1]
        listed.append(hint(key) + (f" on line {line}" if line else ""))
    overrides = f"; and in the overrides: {', '.join(given)}" if given else ""
    return f"{written[in_file[0]][0]}: unknown config key(s): {', '.join(listed)}{overrides}"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML file (optional), apply `key=value` overrides, convert and validate. An error about
    the file names it, and the line where YAML tells."""
    values, written = file_values(path)
    given = parse_overrides(overrides or [])
    values.update(given)
    return build_config(values, {k: v for k, v in written.items() if k not in given})


def file_values(path: str | Path | None) -> tuple[dict[str, Any], Written]:
    """A config file's values by dotted key (the Intel layout translated: its trainer_config.device is
    `device`) and where each was written; empty without a file."""
    if path is None:
        return {}, {}
    path = Path(path)
    loaded, lines = read_yaml_file(path)
    try:
        values = flatten(translate_intel_layout(loaded))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    sections = ("", "trainer_config.", "optimizer_config.")  # where the Intel layout wrote a key
    return values, {
        key: (str(path), next((lines[s + key] for s in sections if s + key in lines), None)) for key in values
    }


def names_key(key: str, path: str | Path | None, overrides: list[str]) -> bool:
    """Whether the file or the overrides set `key` (as load_config reads them), rather than leave it to
    its default; False for a file that does not load (load_config names what is wrong with it)."""
    try:
        return key in parse_overrides(overrides) or key in file_values(path)[0]
    except ConfigError:
        return False
