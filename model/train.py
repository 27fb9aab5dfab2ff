"""Train or fine-tune GPT-2 with data parallelism: one process per rank.

    python -m model.train [--config FILE.yaml] [key=value ...]

Launch one process per rank with torchrun, mpirun or `mpirun ... accelerate launch` (see
model.parallel.distributed); with no launcher it trains as a single process. Rank 0 alone reads the
pretrained weights or the snapshot it resumes from and hands the state to the others over the
process group, so only the head node needs the run directory. See docs/training.md#the-trainer.

This module is the process around one rank's run: the command line, logging, joining and leaving the
process group, and the exit codes (model.conventions); the run itself is model.training's Trainer.

On GPUs it runs one rank per GPU (rank r of a node on cuda:LOCAL_RANK, model.gpt.device), in the
precision the GPU's capability allows (model.gpt.precision), compiled, over NCCL. A GPU step reads
nothing back to the host except at log steps and evaluations: the loss stays a tensor, clipping and
the step guard decide on the device (model.gpt.optim.clip_on_device, StepGuard.judge_on_device), and
per-step host agreements (the stop check) travel over a CPU group beside NCCL.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import socket
import sys

import torch

from model import program
from model.checkpointing.checkpoint import CheckpointError
from model.conventions import EXIT_BUDGET, EXIT_PEER_LOST, EXIT_PROGRAM_ERROR, EXIT_STOPPED
from model.data.batches import DataError
from model.gpt.device import resolve_device
from model.gpt.precision import keep_freed_memory
from model.monitoring.budget import budget_watch
from model.monitoring.health import TrainingDiverged
from model.monitoring.stop_signal import StopRequested, StopSignal
from model.parallel import distributed
from model.parallel.bucket_warmup import warm_up_buckets
from model.parallel.collectives import is_peer_failure
from model.settings.config import ConfigError, TrainConfig, load_config
from model.training.trainer import Trainer

log = logging.getLogger("model.train")

# Errors with a message that says everything: reported as one line, no traceback.
USER_ERRORS = (ConfigError, DataError, CheckpointError, distributed.DistributedSetupError, TrainingDiverged)


def setup_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"[rank {rank} {socket.gethostname()}] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def train(cfg: TrainConfig, env: distributed.RankEnv, stop: StopSignal | None = None) -> Trainer:
    """Join the job (several ranks), train to max_iters, leave; the finished Trainer is returned.
    With a StopSignal, a stop signal ends the run after a snapshot of the last completed step."""
    distributed.check_world_size(env, cfg.expected_world_size)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device, cuda = resolve_device(cfg.device, env.local_rank)  # sets the current GPU before NCCL starts
    backend = distributed.resolve_backend(cfg.backend, device.type)
    if env.world_size > 1:
        distributed.init_process_group(env, backend, cfg.collective_timeout_s, device, cfg.rendezvous_timeout_s)
    log.info("%s", distributed.describe(env, backend if env.world_size > 1 else "none (single process)"))
    trainer = Trainer(cfg, env, device, cuda)
    warm_up_buckets(trainer)  # a resumed run reduces in the uninterrupted run's bucket layout
    trainer.resume_compressor()
    if stop is None and cfg.budget_usd > 0:  # the budget stop travels in the stop agreement
        stop = StopSignal(cfg.stop_grace_s)
    trainer.stop_signal, trainer.budget = stop, budget_watch(cfg, trainer.is_rank0)
    forced = False
    try:
        trainer.run()
    except KeyboardInterrupt:  # a forced stop leaves at once: a background write under way is
        forced = True  # abandoned with the process, and the previous snapshot stays (model.atomic)
        raise
    finally:  # every other way out: the snapshot being written in the background reaches the disk
        if not forced:
            trainer.wait_for_snapshot()
        trainer.metrics.close()  # TensorBoard's last events reach the disk
    # Every rank logs a digest of its final weights: equal digests show DDP kept the replicas identical.
    digest = hashlib.sha256()
    for tensor in trainer.raw_model.state_dict().values():
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    log.info("final parameters sha256 %s", digest.hexdigest()[:16])
    # DDP's reducer holds the process group: without it, leaving the group stops gloo's threads now.
    trainer.ddp = None
    distributed.destroy_process_group()
    return trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program("model.train"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="YAML file (our keys or the Intel guides' gpt2_train_cfg.yaml layout)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, dotted for nesting")
    args = parser.parse_args(argv)
    # `fab stop`, schedulers and clouds about to preempt send SIGTERM: finish the step, snapshot it
    # on every rank, exit (model.monitoring.stop_signal). A second signal or the grace running out: at once.
    stop = StopSignal(grace_s=TrainConfig.stop_grace_s)  # the config's, once it is read
    stop.install()
    try:
        env = distributed.detect_rank_env()
        setup_logging(env.rank)
        cfg = load_config(args.config, args.overrides)
        stop.grace_s = cfg.stop_grace_s
        train(cfg, env, stop)
        return 0
    except StopRequested as e:
        if stop.budget_stop:  # rank 0 logged "stopped at budget: spent $X of $Y at iteration N"
            return EXIT_BUDGET
        cause = stop.signal_name or "another rank was signalled"
        print(f"interrupted ({cause}); {e}, snapshot written", file=sys.stderr)
        return EXIT_STOPPED
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
    except Exception as e:
        # A KeyboardInterrupt raised inside torch.save's write callback comes out of torch's archive
        # writer as a RuntimeError ("unexpected pos"), yet the run was stopped, not broken.
        if stop.forced.is_set():
            return report_interrupted()
        if is_peer_failure(e):
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(
                "error: a collective with the other ranks failed: a rank died, hung longer than "
                f"collective_timeout_s, or is unreachable ({type(e).__name__}: {first_line})",
                file=sys.stderr,
            )
            return EXIT_PEER_LOST
        else:
            log.exception("training failed")
            print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return report_interrupted()
    finally:
        # Every way out leaves the group while the interpreter is whole: a group left to interpreter
        # shutdown takes gloo's threads down with it (SIGABRT). Local for gloo: safe while peers run.
        distributed.destroy_process_group()
        stop.uninstall()
    return EXIT_PROGRAM_ERROR


def report_interrupted() -> int:
    print("interrupted (SIGINT/SIGTERM) mid-step; the previous snapshot is intact", file=sys.stderr)
    return EXIT_STOPPED


if __name__ == "__main__":
    # Process-wide malloc tuning, so only for the program (not for callers importing main()):
    # reuse freed per-step buffers instead of page-faulting them in again every step.
    keep_freed_memory()
    sys.exit(main())
