"""Train or fine-tune GPT-2 with data parallelism: one process per rank.

    python -m model.train [--config FILE.yaml] [key=value ...]

Launch one process per rank with torchrun, mpirun or `mpirun ... accelerate launch` (see
model.distributed); with no launcher it trains as a single process. Rank 0 alone reads the
pretrained weights or the snapshot it resumes from and hands the state to the others over the
process group, so only the head node needs the run directory. See README.md, "Training".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from model import distributed, hf
from model.atomic import atomic_open
from model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from model.config import ConfigError, TrainConfig, load_config
from model.conventions import CKPT_NAME, SNAPSHOT_NAME
from model.data import DataError, TokenBatches
from model.model import GPT, GPTConfig
from model.precision import (
    adamw,
    autocast,
    keep_freed_memory,
    maybe_compile,
    maybe_ipex_optimize,
    resolve_dtype,
)

log = logging.getLogger("model.train")

METRICS_NAME = "metrics.jsonl"
# Errors with a message that says everything: reported as one line, no traceback.
USER_ERRORS = (ConfigError, DataError, CheckpointError, distributed.DistributedSetupError)


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, hung past the timeout or became unreachable."""


# --- schedule and optimizer ------------------------------------------------------------------------


def learning_rate_at(iteration: int, cfg: TrainConfig) -> float:
    """Linear warmup to the peak, cosine decay to min_lr at decay_iters, then constant."""
    peak, floor = cfg.peak_learning_rate(), cfg.final_learning_rate()
    if not cfg.decay_lr:
        return peak
    if iteration < cfg.warmup_iters:
        return peak * (iteration + 1) / (cfg.warmup_iters + 1)
    decay_iters = cfg.decay_iters()
    if iteration >= decay_iters:
        return floor
    progress = (iteration - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (embeddings included), none on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return adamw(groups, lr=cfg.peak_learning_rate(), betas=(cfg.beta1, cfg.beta2))


# --- model sources -------------------------------------------------------------------------------


def scratch_model_config(cfg: TrainConfig) -> GPTConfig:
    shape = cfg.model
    return GPTConfig(
        block_size=cfg.block_size,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        n_embd=shape.n_embd,
        dropout=shape.dropout,
        bias=shape.bias,
    )


def pretrained_model(cfg: TrainConfig) -> GPT:
    """GPT-2 weights from the hub name or Hugging Face directory in init_from, cropped to block_size."""
    try:
        return hf.load_pretrained(cfg.init_from, dropout=cfg.model.dropout, block_size=cfg.block_size)
    except hf.HFCheckpointError as e:
        raise ConfigError(f"init_from={cfg.init_from!r}: {e}") from None
    except ValueError as e:  # the checkpoint's context is shorter than block_size
        raise ConfigError(
            f"init_from={cfg.init_from!r} cannot train on block_size {cfg.block_size}: {e}"
        ) from None


# --- moving state from rank 0 to every rank ------------------------------------------------------


def broadcast_tensors(obj: Any) -> Any:
    """Give every rank rank 0's copy of a nested structure of tensors (e.g. an optimizer state
    dict): the layout goes as a small pickled skeleton, the tensors as plain broadcasts."""
    tensors: list[torch.Tensor] = []

    def skeleton(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return ("__tensor__", tuple(x.shape), x.dtype)
        if isinstance(x, dict):
            return {k: skeleton(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(skeleton(v) for v in x)
        return x

    def materialize(x: Any) -> Any:
        if isinstance(x, tuple) and len(x) == 3 and x[0] == "__tensor__":
            tensors.append(torch.empty(x[1], dtype=x[2]))
            return tensors[-1]
        if isinstance(x, dict):
            return {k: materialize(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(materialize(v) for v in x)
        return x

    box = [skeleton(obj) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    result = obj if dist.get_rank() == 0 else materialize(box[0])
    for t in tensors:
        dist.broadcast(t, src=0)
    return result


def on_rank0(fn: Callable[[], Any], world_size: int) -> Any:
    """Run fn on rank 0 only and hand its (small, picklable) result to every rank. A user error on
    rank 0 is raised on every rank, so nobody waits for a broadcast that never comes."""
    if world_size == 1:
        return fn()
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except USER_ERRORS as e:
            box[0] = ("error", type(e).__name__, str(e))
    dist.broadcast_object_list(box, src=0)
    if box[0][0] == "error":
        error_type = {cls.__name__: cls for cls in USER_ERRORS}[box[0][1]]
        raise error_type(box[0][2] if dist.get_rank() == 0 else f"on rank 0: {box[0][2]}")
    return box[0][1]


# --- the run -------------------------------------------------------------------------------------


@dataclasses.dataclass
class StartState:
    """What rank 0 read at start, as every rank receives it."""

    model_config: dict[str, Any]
    iter_num: int = 0
    best_val_loss: float = float("inf")
    rng: list[dict[str, Any]] | None = None
    resumed_from: str | None = None


def measure_matmul_peak(dtype: torch.dtype, seconds: float = 0.3, n: int = 1024) -> float:
    """FLOP/s of a square matmul in dtype on this process's threads: MFU's denominator."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    reps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a @ b
        reps += 1
    return 2 * n**3 * reps / elapsed


class Trainer:
    def __init__(self, cfg: TrainConfig, env: distributed.RankEnv):
        self.cfg, self.env = cfg, env
        self.is_rank0 = env.rank == 0
        self.out_dir = Path(cfg.out_dir)
        self.dtype = resolve_dtype(cfg.mixed_precision)
        self.data = TokenBatches(cfg.data_dir, cfg.block_size, cfg.batch_size, cfg.seed, env.rank)

        start, payload = self._read_start_state()
        torch.manual_seed(cfg.seed)  # identical initial weights everywhere; DDP syncs them anyway
        self.raw_model = GPT(GPTConfig(**start.model_config))
        if payload is not None:  # rank 0: the weights it read
            self.raw_model.load_state_dict(payload.pop("model"))
        self.iter_num, self.best_val_loss = start.iter_num, start.best_val_loss
        self.start_iter = start.iter_num if start.resumed_from else None

        self.optimizer = build_optimizer(self.raw_model, cfg)
        optimizer_state = payload.pop("optimizer", None) if payload else None
        if start.resumed_from:
            if env.world_size > 1:
                optimizer_state = broadcast_tensors(optimizer_state)
            self.optimizer.load_state_dict(optimizer_state)
        self._restore_rng(start)

        self.raw_model, self.optimizer, ipex = maybe_ipex_optimize(self.raw_model, self.optimizer, self.dtype)
        self.model = maybe_compile(self.raw_model, cfg.compile)
        self.ddp = None
        if env.world_size > 1:
            # Constructing DDP broadcasts rank 0's parameters, so every rank starts from its weights.
            self.ddp = DistributedDataParallel(
                self.model, bucket_cap_mb=cfg.ddp_bucket_cap_mb, gradient_as_bucket_view=True
            )
        self.peak_flops = cfg.peak_flops or measure_matmul_peak(self.dtype)
        self.flops_per_token = self.raw_model.flops_per_token(cfg.block_size)
        self.tokens_per_iter = (
            cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps * env.world_size
        )
        if start.resumed_from:
            log.info("resumed from %s at iteration %d", start.resumed_from, self.iter_num)
        log.info(
            "model %.2fM parameters, %s, dtype %s, compile %s, IPEX %s; %d tokens per optimizer step; "
            "MFU against %.1f GFLOP/s per rank (%s)",
            self.raw_model.num_params() / 1e6,
            dataclasses.asdict(self.raw_model.config),
            str(self.dtype).removeprefix("torch."),
            cfg.compile,
            "applied" if ipex else "not used",
            self.tokens_per_iter,
            self.peak_flops / 1e9,
            "peak_flops" if cfg.peak_flops else f"measured matmul peak, {torch.get_num_threads()} threads",
        )

    # -- start: resume, pretrained or scratch (decided and read on rank 0 only) --

    def _read_start_state(self) -> tuple[StartState, dict[str, Any] | None]:
        payload_box: dict[str, Any] = {}

        def read() -> StartState:
            snapshot = self.out_dir / SNAPSHOT_NAME
            if snapshot.exists():
                try:
                    payload = load_checkpoint(snapshot)
                except CheckpointError as e:
                    raise CheckpointError(
                        f"{e}. Delete it (or choose another out_dir) to start over; {CKPT_NAME} next "
                        "to it holds the best weights so far"
                    ) from None
                self._check_resumable(payload)
                payload_box.update(payload)
                return StartState(
                    payload["model_config"],
                    payload["iter_num"],
                    payload["best_val_loss"],
                    payload.get("rng"),
                    str(snapshot),
                )
            if self.cfg.init_from == "scratch":
                return StartState(dataclasses.asdict(scratch_model_config(self.cfg)))
            model = pretrained_model(self.cfg)
            payload_box["model"] = model.state_dict()
            return StartState(dataclasses.asdict(model.config))

        start = on_rank0(read, self.env.world_size)
        return start, (payload_box if self.is_rank0 and payload_box else None)

    def _check_resumable(self, payload: dict[str, Any]) -> None:
        before = payload["config"]
        for key in ("block_size", "batch_size", "gradient_accumulation_steps"):
            if before.get(key) != getattr(self.cfg, key):
                raise ConfigError(
                    f"{key} is {getattr(self.cfg, key)} but the snapshot in {self.out_dir} was trained with "
                    f"{before.get(key)}: keep it to resume, or use another out_dir for a new run"
                )

    def _restore_rng(self, start: StartState) -> None:
        if start.rng is not None and len(start.rng) == self.env.world_size:
            torch.set_rng_state(start.rng[self.env.rank]["torch"])
            return
        if start.rng is not None:
            log.warning(
                "snapshot holds RNG states of %d ranks, this run has %d: dropout masks are reseeded",
                len(start.rng),
                self.env.world_size,
            )
        # Different dropout masks per rank, reproducibly.
        torch.manual_seed(self.cfg.seed + 1 + self.env.rank + self.iter_num * self.env.world_size)

    # -- collectives --

    def all_ranks_mean(self, value: float) -> float:
        if self.env.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / self.env.world_size

    def gather_rng_states(self) -> list[dict[str, Any]] | None:
        state = {"torch": torch.get_rng_state()}
        if self.env.world_size == 1:
            return [state]
        states: list[Any] | None = [None] * self.env.world_size if self.is_rank0 else None
        dist.gather_object(state, states, dst=0)
        return states

    # -- steps --

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        losses = {}
        for split in ("train", "val"):
            total = 0.0
            for k in range(self.cfg.eval_iters):
                # The same windows at every eval, so successive val losses (and ckpt.pt's choice)
                # compare the model, not the sample.
                x, y = self.data.get(split, 0, k, stream="eval")
                with autocast(self.dtype):
                    _, loss = self.model(x, y)
                total += loss.item()
            losses[split] = self.all_ranks_mean(total / self.cfg.eval_iters)
        self.model.train()
        return losses

    def train_step(self) -> float:
        """One optimizer step: accumulate gradients over the micro-batches, syncing on the last."""
        lr = learning_rate_at(self.iter_num, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        steps = self.cfg.gradient_accumulation_steps
        model = self.ddp or self.model
        total = 0.0
        for micro_step in range(steps):
            x, y = self.data.get("train", self.iter_num, micro_step)
            last = micro_step == steps - 1
            sync = contextlib.nullcontext() if (last or self.ddp is None) else self.ddp.no_sync()
            with sync:
                with autocast(self.dtype):
                    _, loss = model(x, y)
                # DDP averages gradients over ranks; dividing here averages over micro-steps.
                (loss / steps).backward()
            total += loss.item()
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total / steps

    # -- outputs (rank 0) --

    def record(self, entry: dict[str, Any]) -> None:
        with open(self.out_dir / METRICS_NAME, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def checkpoint_payload(self, **extra: Any) -> dict[str, Any]:
        return dict(
            model=self.raw_model.state_dict(),
            model_config=dataclasses.asdict(self.raw_model.config),
            config=self.cfg.to_dict(),
            iter_num=self.iter_num,
            best_val_loss=self.best_val_loss,
            **extra,
        )

    def eval_and_checkpoint(self) -> None:
        losses = self.evaluate()
        improved = losses["val"] < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, losses["val"])
        if self.is_rank0:
            log.info(
                "eval iter %d: train loss %.4f, val loss %.4f", self.iter_num, losses["train"], losses["val"]
            )
            self.record(
                {
                    "kind": "eval",
                    "iter": self.iter_num,
                    "train_loss": losses["train"],
                    "val_loss": losses["val"],
                }
            )
        if self.cfg.eval_only or self.iter_num == 0:  # nothing trained yet: nothing to save
            return
        rng = self.gather_rng_states()  # every rank takes part
        if self.is_rank0:
            save_checkpoint(
                self.checkpoint_payload(optimizer=self.optimizer.state_dict(), rng=rng),
                self.out_dir / SNAPSHOT_NAME,
            )
            if improved:
                save_checkpoint(self.checkpoint_payload(), self.out_dir / CKPT_NAME)
                log.info("val loss improved: wrote %s", self.out_dir / CKPT_NAME)

    def run(self) -> None:
        cfg = self.cfg
        if self.is_rank0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if self.start_iter is None:  # a new run starts a new metrics file
                (self.out_dir / METRICS_NAME).unlink(missing_ok=True)
            else:
                rewind_metrics(self.out_dir / METRICS_NAME, self.start_iter)
        while True:
            resuming_here = self.iter_num == self.start_iter
            at_end = self.iter_num >= cfg.max_iters
            if cfg.eval_only or ((self.iter_num % cfg.eval_interval == 0 or at_end) and not resuming_here):
                self.eval_and_checkpoint()
            if cfg.eval_only or at_end:
                return
            started = time.perf_counter()
            loss = self.train_step()
            iter_s = time.perf_counter() - started
            if self.iter_num % cfg.log_interval == 0:
                self.log_step(self.all_ranks_mean(loss), iter_s)
            self.iter_num += 1

    def log_step(self, loss: float, iter_s: float) -> None:
        tokens_per_s = self.tokens_per_iter / iter_s
        mfu = self.flops_per_token * tokens_per_s / (self.peak_flops * self.env.world_size)
        lr = self.optimizer.param_groups[0]["lr"]
        if not self.is_rank0:  # the step is global: one line per step, from rank 0
            return
        log.info(
            "iter %d: loss %.4f, lr %.3e, %.1f ms, %.0f tokens/s, MFU %.1f%%",
            self.iter_num,
            loss,
            lr,
            iter_s * 1e3,
            tokens_per_s,
            100 * mfu,
        )
        self.record(
            {
                "kind": "train",
                "iter": self.iter_num,
                "loss": loss,
                "lr": lr,
                "iter_ms": iter_s * 1e3,
                "tokens_per_s": tokens_per_s,
                "mfu": mfu,
            }
        )


def rewind_metrics(path: Path, resume_iter: int) -> None:
    """Drop the records a crashed run wrote after its last snapshot: the resumed run redoes those
    steps, and the file should read like the uninterrupted run's."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines(keepends=True)
        if line.strip() and _record_before(json.loads(line), resume_iter)
    ]
    with atomic_open(path, "w") as f:
        f.write("".join(kept))


def _record_before(record: dict[str, Any], resume_iter: int) -> bool:
    # The eval at the snapshot's iteration happened before the snapshot; the step there did not.
    return record["iter"] <= resume_iter if record["kind"] == "eval" else record["iter"] < resume_iter


# --- entry point ---------------------------------------------------------------------------------


def setup_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"[rank {rank} {socket.gethostname()}] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def is_peer_failure(error: BaseException) -> bool:
    """Collective failures: gloo reports a dead peer as a connection reset/closed, a hung one as a
    timeout; both arrive as DistError subclasses or RuntimeErrors from the backend."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ("gloo", "connection closed", "connection reset", "timed out", "ccl")
    )


def train(cfg: TrainConfig, env: distributed.RankEnv) -> Trainer:
    """Join the job (several ranks), train to max_iters, leave; the finished Trainer is returned."""
    distributed.check_world_size(env, cfg.expected_world_size)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    backend = distributed.resolve_backend(cfg.backend)
    if env.world_size > 1:
        distributed.init_process_group(env, backend, cfg.collective_timeout_s)
    log.info("%s", distributed.describe(env, backend if env.world_size > 1 else "none (single process)"))
    trainer = Trainer(cfg, env)
    trainer.run()
    # Every rank logs a digest of its final weights: equal digests show DDP kept the replicas identical.
    digest = hashlib.sha256()
    for tensor in trainer.raw_model.state_dict().values():
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    log.info("final parameters sha256 %s", digest.hexdigest()[:16])
    # DDP's reducer holds the process group: without it, leaving the group stops gloo's threads now.
    trainer.ddp = None
    distributed.destroy_process_group()
    return trainer


# Set by the SIGINT/SIGTERM handler. The exception that reaches main() is not always the
# KeyboardInterrupt it raised: raised inside torch.save's write callback, it comes out of torch's
# archive writer as a RuntimeError ("unexpected pos"), yet the run was stopped, not broken.
stop_requested = threading.Event()


def interrupt(signum: int, frame: Any) -> None:
    stop_requested.set()
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.train", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", help="YAML file (our keys or the Intel guides' gpt2_train_cfg.yaml layout)"
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, dotted for nesting")
    args = parser.parse_args(argv)
    # `fab stop` and schedulers send SIGTERM: unwind like Ctrl-C, so a snapshot being written is
    # abandoned cleanly (its temporary file removed) and the exit is reported.
    stop_requested.clear()
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        previous_handlers = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        env = distributed.detect_rank_env()
        setup_logging(env.rank)
        train(load_config(args.config, args.overrides), env)
        return 0
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
    except Exception as e:
        if stop_requested.is_set():
            return report_interrupted()
        if is_peer_failure(e):
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(
                "error: a collective with the other ranks failed: a rank died, hung longer than "
                f"collective_timeout_s, or is unreachable ({type(e).__name__}: {first_line})",
                file=sys.stderr,
            )
        else:
            logging.getLogger("model.train").exception("training failed")
            print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return report_interrupted()
    finally:
        # Every way out leaves the group while the interpreter is whole: a group left to interpreter
        # shutdown takes gloo's threads down with it (SIGABRT). Local for gloo: safe while peers run.
        distributed.destroy_process_group()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    return 1


def report_interrupted() -> int:
    print("error: interrupted (SIGINT/SIGTERM); the last snapshot is intact", file=sys.stderr)
    return 130


if __name__ == "__main__":
    # Process-wide malloc tuning, so only for the program (not for callers importing main()):
    # reuse freed per-step buffers instead of page-faulting them in again every step.
    keep_freed_memory()
    sys.exit(main())
