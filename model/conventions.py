"""Names the trainer and the launcher must agree on, in one place.

The launcher (operator's machine) imports this module and nothing else of model/: it holds plain
constants only, so importing it costs nothing and pulls in no torch.
"""

from __future__ import annotations

BACKEND_CHOICES = ("auto", "nccl", "ccl", "gloo")
"""Collective backends a run may ask for: auto picks nccl on a GPU, else ccl where the oneCCL bindings
import, else gloo."""

DEVICE_CHOICES = ("auto", "cpu", "cuda")
"""Where a rank computes: auto takes the GPU numbered LOCAL_RANK when the rank sees one, else the CPU."""

ONECCL_MODULE = "oneccl_bindings_for_pytorch"
"""The module whose import registers the ccl backend with torch.distributed."""

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags of CPUs that multiply bf16 natively; elsewhere bf16 is emulated and slower."""

MIXED_PRECISION_CHOICES = ("auto", "fp32", "bf16", "fp16")
"""The trainer's mixed_precision values (model.gpt.precision): auto picks bf16 where the CPU (BF16_CPU_FLAGS)
or the GPU multiplies it natively, fp16 with a gradient scaler on GPUs that do not, else fp32."""

# The launcher's fab sample / fetch and model.sample look for these names in a run's out_dir.
CKPT_NAME = "ckpt.pt"
SNAPSHOT_NAME = "snapshot.pt"
TB_DIR = "tb"
"""TensorBoard's event files, under out_dir (model.monitoring.tensorboard_log writes them; `fab fetch` copies them)."""

# How a rank's process ends, as its exit status: the launcher's self-healing retries only failures
# from outside the program (a peer lost, a stop signal it did not send, a signal death such as the
# OOM killer's 137), never the program's own errors.
EXIT_PROGRAM_ERROR = 1
"""Bad config, missing data or an exception in training: rerunning would fail the same way."""

EXIT_PEER_LOST = 75
"""A collective with the other ranks failed (a peer died, hung past collective_timeout_s or became
unreachable): this rank is fine and a restart may succeed. 75 is sysexits' EX_TEMPFAIL."""

EXIT_STOPPED = 130
"""Stopped by SIGINT/SIGTERM (`fab stop`, Ctrl-C, or a cloud's preemption notice) after keeping the
last snapshot intact."""

GRAD_COMPRESSION_CHOICES = ("auto", "none", "bf16", "fp16", "powersgd")
"""How DDP sends gradients between ranks (model.parallel.comm_hooks): auto picks by a link measurement at start."""

EXIT_BUDGET = 3
"""Stopped at the run's budget (model.monitoring.budget) with a snapshot of the last completed step: not a
failure and not retried; `fab train` exits with it too, so scripts tell "stopped at budget" from
"finished" (0) and "failed" (1). 3 is none of the above, no signal death (128 + n) and not
argparse's usage error (2)."""

DEFAULT_MAX_ITERS = 200
"""Optimizer steps of a run whose config sets no max_iters (TrainConfig's default; the launcher's
budget estimate reads it here)."""

DEFAULT_MASTER_PORT = 29500
"""Rendezvous port on the head when none is given (torch.distributed's usual one); the local cluster
picks a free loopback port instead."""
MASTER_PORTS = range(1024, 65536)
"""The rendezvous ports a run may use: unprivileged ones (the ranks do not run as root)."""

LAUNCH_COLLECTIVE_TIMEOUT_S = 120.0
"""collective_timeout_s of a run the launcher starts (`fab train --collective-timeout`); a trainer
started by hand keeps TrainConfig's own default."""

# `fab sample` and `python -m model.sample`: what the generated text looks like unless told otherwise.
SAMPLE_MAX_NEW_TOKENS = 100
"""Tokens to generate."""
SAMPLE_TEMPERATURE = 0.8
"""Softmax temperature; 0 always takes the most likely token."""
SAMPLE_TOP_K = 200
"""Sample only among the K most likely tokens."""
SAMPLE_SEED = 1337
"""Random seed: the same seed gives the same text."""
SAMPLE_LEAST = {"max_new_tokens": 1, "temperature": 0, "top_k": 1}
"""Each sampling option's least value (temperature 0 is greedy): model.sample refuses less, and `fab
sample` refuses it before anything runs on the head."""

LAUNCHER_ENV = "NANOCLUSTER_LAUNCHER"
"""Set by `fab train` in every rank's environment: the launcher that started the rank (fabric, mpirun,
torchrun), which the variables alone do not tell (fabric sets torchrun's RANK and WORLD_SIZE)."""

NODE_ENV = "NANOCLUSTER_NODE"
"""Set by the launcher where it runs a model program in a cluster's node environment (a VM node, a
Kubernetes Job): the place, as the operator knows it (node0, claim nanocluster-data). Unset on the
local cluster and by hand: the program's Python is then the operator's own."""
NODE_FIX_ENV = "NANOCLUSTER_NODE_FIX"
"""Set with NODE_ENV: how that node environment gets a package it lacks (rerun `nanocluster setup`, or
install into the contract's node_python), which model.environment's line names instead of a pip
command for the operator's machine."""
