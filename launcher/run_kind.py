"""What a kind of cluster and the run lifecycle (launcher.lifecycle) hand each other: the request
(`fab train`'s flags), what the lifecycle's checks prepared, an attempt started, capacity recovered,
and RunKind, the one interface a kind of cluster implements (launcher.train for machines over SSH,
launcher.kube.train for Kubernetes): how an attempt starts, is watched, stopped and recovered.
Everything else about a run is the lifecycle's, shared by every kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from launcher.cluster.inventory import Cluster, Node
from launcher.console import TaskError, command_line
from launcher.launch.monitor import Progress, RunFailed
from launcher.recover.policy import GlobalBatch, RecoverOptions
from launcher.trainer_config import run_device
from model.conventions import LAUNCH_COLLECTIVE_TIMEOUT_S
from model.settings.config import TrainConfig


@dataclass(frozen=True)
class TrainRequest:
    """`fab train`'s flags, as every kind reads them."""

    cluster_spec: str | None
    """--cluster: local, stack, stack:NAME, a contract file, or kubeconfig:PATH[#CONTEXT]."""
    nodes: int | None = None
    """--nodes: how many of the cluster's nodes the run uses (None: every node)."""
    nodes_from: str = ""
    """Why nodes is set when --nodes was not given (checked_request: the count its snapshot was trained
    with), for the line every task opens with; "" for --nodes."""
    run: str = "main"
    """--run: the run's name; a rerun of the same name resumes from its snapshot."""
    dataset: str = "builtin"
    """--dataset: data/<dataset> on the nodes."""
    launcher: str = "fabric"
    """--launcher: fabric, mpirun or torchrun (machines only)."""
    backend: str = "auto"
    """--backend: the process group's backend (auto, ccl, gloo)."""
    port: int | None = None
    """--port: the rendezvous port on rank 0's node (None: the kind's default)."""
    config: str | None = None
    """--config: the trainer's YAML file (None: the kind's default, if it has one)."""
    overrides: tuple[str, ...] = ()
    """--set key=value, in order."""
    dry_run: bool = False
    """--dry-run: print what would start, start nothing."""
    collective_timeout_s: float = LAUNCH_COLLECTIVE_TIMEOUT_S
    """--collective-timeout: seconds a rank waits for a lost peer."""
    recover: RecoverOptions = field(default_factory=RecoverOptions)
    """The self-healing flags (--max-restarts, --recover-timeout, --min-nodes)."""
    budget_usd: float | None = None
    """--budget: US dollars the run may spend (None: no budget)."""
    detach: bool = False
    """--detach: return once every rank has started; the run goes on under its supervisor."""
    rerun: str = ""
    """The command that continues the run after Ctrl-C or `stop` (the flags as given, --detach
    included; default: the train command with --cluster and --run). At the budget the continue line
    is the train command with --cluster, --run, --detach if given, and a larger --budget."""
    asked_at: float | None = None
    """When `fab train` was run (Unix time; checked_request sets it): a stop request older than this is
    an earlier run's, which the first attempt's start clears; a newer one stops this run, even before its
    first attempt (`fab stop` after a front end left while its supervisor was starting)."""

    @property
    def rerun_command(self) -> str:
        return self.rerun or command_line("train", cluster=self.cluster_spec, run=self.run)

    @property
    def local_device(self) -> str:
        """The trainer's device setting its --config and --set give (launcher.trainer_config.run_device),
        which shapes the local cluster; a resume that names none has its snapshot's device added to
        overrides (launcher.lifecycle.on_trained_device)."""
        return run_device(self.config, self.overrides)


@dataclass(frozen=True)
class Prepared:
    """What the lifecycle's checks settled, for the kind to start attempts with."""

    config_file: str | None
    """--config, or the kind's default config (None: the trainer's defaults)."""
    config_text: str
    """Its text ('' without a file)."""
    trainer_config: TrainConfig
    """The checked trainer config the ranks will read."""
    overrides: tuple[str, ...]
    """--set and the budget's trainer keys (every attempt's overrides start with these)."""
    global_batch: GlobalBatch
    """The sequences per optimizer step a restart on fewer nodes keeps (--min-nodes)."""


@dataclass(frozen=True)
class Started:
    """An attempt whose ranks were started."""

    nodes: tuple[Node, ...]
    """The nodes (or pods) it runs on."""
    world_size: int
    """Its ranks."""


@dataclass(frozen=True)
class Recovered:
    """What the next attempt runs on, once the kind has brought its capacity back."""

    nodes: tuple[str, ...]
    """The names of the nodes (or pods) it will run on."""
    dropped: tuple[str, ...] = ()
    """Nodes left out under --min-nodes."""


class RunKind(Protocol):
    """What a kind of cluster supplies to the run lifecycle; everything else is shared."""

    cluster: Cluster
    """The resolved cluster (read without contacting it)."""
    nodes: tuple[Node, ...]
    """The nodes --nodes selected."""

    def default_config(self) -> str | None:
        """The trainer config a run without --config uses on this cluster (None: the trainer's defaults)."""
        ...

    def dry_run(self, prepared: Prepared) -> None:
        """Print what an attempt would start; start nothing."""
        ...

    def open(self, prepared: Prepared) -> None:
        """Connect, check that the run fits, make the cluster ready (a TaskError before anything starts)."""
        ...

    def start(self, attempt: int, extra_overrides: tuple[str, ...]) -> Started:
        """Start attempt number `attempt` (0 first) with these overrides after the prepared ones."""
        ...

    def watch(self) -> Progress:
        """Follow the started attempt to its end: its Progress, or RunFailed / RunInterrupted once every
        rank was stopped."""
        ...

    def stop(self) -> None:
        """Stop whatever of the run is running (Ctrl-C while an attempt was being started)."""
        ...

    def stop_requested(self) -> float | None:
        """When an operator's stop (`fab stop`, from anywhere) asked this attempt's run to end (Unix
        time), else None; None too when the kind cannot tell now (launcher.launch.operator_stop)."""
        ...

    def unretryable(self, error: RunFailed) -> str | None:
        """The reason a failure must end the run whatever the policy says (an OOM kill), else None."""
        ...

    def own_restart(self, error: RunFailed, restarts: int) -> str | None:
        """A restart cause the kind handles itself that the shared policy cannot see, else None."""
        ...

    def lost_while_starting(self, error: TaskError) -> str | None:
        """The restart cause when a start failed because capacity went away, else None (the error stands)."""
        ...

    def recover(self) -> Recovered:
        """Bring capacity back for the next attempt; a TaskError when the run cannot go on."""
        ...

    def extra_overrides(self) -> tuple[str, ...]:
        """Trainer overrides the kind's recovery adds (keep_global_batch=true on fewer nodes)."""
        ...

    def finish(self) -> None:
        """After the run's end event: remove what the finished run leaves on the cluster."""
        ...

    def checkpoint_place(self) -> str:
        """The best checkpoint's path and place, for the done line: as `fab sample` names it on machines
        ("/home/you/nanocluster/runs/main/ckpt.pt on local0", "~/nanocluster/runs/main/ckpt.pt on
        node0"), under the claim on Kubernetes ("runs/main/ckpt.pt on claim NAME")."""
        ...

    def close(self) -> None:
        """Release connections, whatever the end."""
        ...
