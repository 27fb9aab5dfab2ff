"""One run lifecycle for every kind: the same scenarios through the machines kind (the local cluster,
real ranks) and the Kubernetes kind (the in-memory API of tests/launcher/kube/fake.py), with the same
outcome on both: a finished run rerun answers "already finished" from this machine's record with no
node contacted and no API object created; the done line carries the budget's spend; a budget stop
ends with the same record and last line."""

from __future__ import annotations

import dataclasses
import shlex
import time

import pytest

import launcher.train
from launcher.cluster.local import local_cluster
from launcher.launch.monitor import RunFailed
from launcher.runs.record import RunRecord
from launcher.testing.fab import TINY_CONFIG
from model.conventions import EXIT_BUDGET
from tests.launcher.dataset import write_dataset

PRICE = 36000.0
"""$/h of the machines kind's priced local cluster: $10 a second, so a budget of $150 is reached within
seconds of training (as in tests/launcher/runs/test_budget_run.py)."""
TRAIN_RECORDS = [{"kind": "start", "iter": 0, "max_iters": 4, "tokens_per_iter": 64}] + [
    {"kind": "train", "iter": i, "loss": 4.0 - i / 10, "iter_ms": 50.0, "tokens_per_s": 1280.0} for i in range(4)
]
"""What rank 0's metrics.jsonl holds after a 4-step run (the Kubernetes fake streams these)."""


class MachinesKind:
    """The local cluster, priced, with a tiny trainer config on a tiny dataset."""

    name = "machines"

    def __init__(self, local_home, tmp_path, monkeypatch):
        self.cluster = dataclasses.replace(local_cluster(1), hourly_cost_usd=PRICE)
        monkeypatch.setattr(
            launcher.train,
            "resolve_cluster",
            lambda spec, nodes=None, why="", recorded=False, device="auto": self.cluster,
        )
        write_dataset(local_home / "data" / "d")
        self.config = tmp_path / "tiny.yaml"
        self.config.write_text(TINY_CONFIG.replace("block_size: 32", "block_size: 4"))
        self.monkeypatch = monkeypatch
        self.checkpoint = f"{local_home}/runs/fin/ckpt.pt on local0"

    def args(self, run: str, *more: str) -> tuple[str, ...]:
        return (
            "train",
            "--nodes",
            "1",
            "--run",
            run,
            "--dataset",
            "d",
            "--config",
            str(self.config),
            "--set",
            "max_iters=4",
            *more,
        )

    def forbid_contact(self) -> list[str]:
        contacts: list[str] = []

        def opened(*args, **kwargs):
            contacts.append("Session.open")
            raise RunFailed("a node was contacted")

        self.monkeypatch.setattr(launcher.train.Session, "open", opened)
        return contacts

    def stop_at_budget(self, run: str) -> tuple[str, ...]:
        return self.args(
            run, "--budget", "150", "--set", "eval_interval=5", "--set", "log_interval=1", "--set", "max_iters=100000"
        )


class KubernetesKind:
    """The in-memory API, its ranks scripted: they log TRAIN_RECORDS and succeed, or stop at the budget."""

    name = "kubernetes"

    def __init__(self, fake, contract_file, script, monkeypatch):
        from launcher.cluster.contract import parse_contract
        from tests.launcher.kube.fake import stream_metrics

        fake.seed()
        self.fake, self.script, self.monkeypatch = fake, script, monkeypatch
        self.spec = str(contract_file)
        self.cluster = parse_contract(fake.contract(), self.spec)
        self.checkpoint = f"runs/fin/ckpt.pt on claim {self.cluster.kube.storage_claim}"
        stream_metrics(monkeypatch, TRAIN_RECORDS)

    def args(self, run: str, *more: str) -> tuple[str, ...]:
        return ("train", "--cluster", self.spec, "--nodes", "2", "--run", run, "--set", "max_iters=4", *more)

    def forbid_contact(self) -> list[str]:
        import launcher.kube.connect
        import launcher.kube.train

        contacts: list[str] = []

        def connected(*args, **kwargs):
            contacts.append("connect")
            raise RunFailed("the API server was contacted")

        for module in (launcher.kube.connect, launcher.kube.train):
            self.monkeypatch.setattr(module, "connect", connected)
        return contacts

    def stop_at_budget(self, run: str) -> tuple[str, ...]:
        from tests.launcher.kube.fake import stream_metrics

        self.script.fail[(0, 0)] = self.script.fail[(0, 1)] = EXIT_BUDGET  # every rank stops at the same step
        stream_metrics(self.monkeypatch, [*TRAIN_RECORDS[:3], {"kind": "stop", "iter": 2, "reason": "budget"}])
        return (
            "train",
            "--cluster",
            self.spec,
            "--nodes",
            "2",
            "--run",
            run,
            "--budget",
            "5",
            "--set",
            "max_iters=100000",
        )


@pytest.fixture(params=[pytest.param("machines", marks=pytest.mark.integration), "kubernetes"])
def kind(request, tmp_path, monkeypatch):
    if request.param == "machines":
        local_home = request.getfixturevalue("local_home")
        return MachinesKind(local_home, tmp_path, monkeypatch)
    fake, contract_file, script = (request.getfixturevalue(name) for name in ("fake", "contract_file", "script"))
    return KubernetesKind(fake, contract_file, script, monkeypatch)


def created_objects(kind) -> int:
    return len(kind.fake.created_jobs) if isinstance(kind, KubernetesKind) else 0


def test_a_finished_run_is_done_with_its_spend_and_a_rerun_is_already_finished_without_contact(kind, task):
    ran = task(*kind.args("fin", "--budget", "1000"))
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    done = ran.out.strip().splitlines()[-1]
    assert done.startswith("done in ") and "; cost $" in done, done
    # where the checkpoint is as `fab sample` names it: the local cluster's absolute path, the claim's
    assert f" of the $1000.00 budget); best checkpoint {kind.checkpoint} (fab sample " in done, done
    end = RunRecord.of(kind.cluster, "fin").events[-1]
    assert (end["event"], end["outcome"]) == ("end", "finished")

    objects_before = created_objects(kind)
    contacts = kind.forbid_contact()
    started = time.monotonic()
    ran = task(*kind.args("fin"))
    took = time.monotonic() - started
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    assert "run fin already finished at iter 4 (max_iters 4): nothing to train" in ran.out
    further = shlex.join(["fab", *kind.args("fin")]).replace("max_iters=4", "max_iters=8")  # the flags as given
    assert f"to train further, rerun with a larger max_iters: `{further}` (any above 4)" in ran.out, ran.out
    assert contacts == [] and created_objects(kind) == objects_before
    assert RunRecord.of(kind.cluster, "fin").events[-1] == end  # nothing recorded
    print(f"{kind.name}: already finished in {took:.2f} s")


def test_a_budget_stop_ends_the_same_way(kind, task):
    ran = task(*kind.stop_at_budget("cap"))
    assert ran.code == EXIT_BUDGET, ran.out[-3000:] + ran.err[-3000:]
    assert "restart" not in ran.out + ran.err
    end = RunRecord.of(kind.cluster, "cap").events[-1]
    assert end["event"] == "end" and end["outcome"] == "budget" and end["iter"] >= 1, end
    last = ran.out.strip().splitlines()[-1]
    assert last.startswith("stopped at budget: spent $") and f" at iteration {end['iter']} " in last, last
    given = f"--cluster {kind.spec} " if isinstance(kind, KubernetesKind) else ""  # the --cluster given, repeated
    assert f"rerun `fab train {given}--run cap --budget <more than " in last
    assert f"resumes from the snapshot at iteration {end['iter']}" in last
