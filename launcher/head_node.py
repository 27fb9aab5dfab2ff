"""The head node's side of a run supervised there (a VM cluster's rank 0 machine), so the run outlives
the operator's machine: a closed laptop or a lost network leaves it restarting, budgeted and recorded to
its end. The operator's side sends these commands over SSH and follows the run (launcher.head_watch):

    start      the cluster as the head sees it (the contract, with the head reached at its private
               address) written to SUPERVISOR_HOME/cluster.json; the run's lock taken in the head's
               record directory (a second train of a live run refuses, as on this machine); the
               supervisor started as ThisMachine starts one (its own session, stdin /dev/null, output to
               the run's log), so it survives the SSH session closing
    sync       the record's files from the offsets the operator's copy has reached, and whether the
               supervisor is live: the front end appends them to this machine's record directory
    interrupt  Ctrl-C for the run: SIGINT to the head's live supervisor
    revived    a Pulumi stack's lost VMs revived by the front end (the head holds no cloud credentials):
               the stack's contract read again, and the answer the supervisor waits for
               (launcher.recover.front_end_revival)

A followed run has a `sync` every second on the head, where rank 0 trains: this module imports only
what these commands use (not Fabric, the run kinds or the tasks), which makes each a third of the CPU
it was (about 0.1 CPU-s here, not 0.26); `start` imports the supervisor's modules itself.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from launcher.cluster.contract import load_cluster
from launcher.cluster.local import LOCAL_HOME_ENV
from launcher.console import OPERATOR_CLUSTER_ENV, TaskError
from launcher.launch.supervisor import (
    LOCK_NAME,
    STARTING,
    STATE_NAME,
    SupervisorState,
    interrupt,
    is_live,
    log_size,
    read_state,
    state_path,
    take_lock,
    write_state,
)
from launcher.runs.metrics_copy import PLOT_NAME
from launcher.runs.record import RunRecord
from launcher.terminal import LOG_NAME

CONTRACT_NAME = "cluster.json"
SYNC_CHUNK = 4 << 20
"""Bytes of one file a sync call brings at most (a long log arrives over several calls)."""
WHOLE_SUFFIXES = (".json",)
"""Files rewritten in place (supervisor.json): copied whole at every sync; the rest are appended to."""


def write_contract(home: Path, contract: dict) -> Path:
    """The cluster as the head's supervisor reads it (it holds the cluster key: the owner's alone)."""
    home.mkdir(parents=True, exist_ok=True)
    contract_path = home / CONTRACT_NAME
    fd = os.open(contract_path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(contract, f)
    os.replace(contract_path.with_suffix(".tmp"), contract_path)
    return contract_path


def revived_on_head(run: str, answer: dict) -> bool:
    """`revived`: the front end's answer to the supervisor's revival request: the stack's contract read
    again after its `pulumi up` (the nodes' new addresses) written where the supervisor reads its
    cluster, then the answer it waits for (launcher.recover.front_end_revival)."""
    from launcher.recover.front_end_revival import write_answer

    if answer.get("contract"):
        write_contract(Path(os.environ[LOCAL_HOME_ENV]), answer["contract"])
    directory = record_on_head(run)
    if not directory.is_dir():
        return False
    write_answer(directory, {key: answer.get(key) for key in ("id", "revived", "why")})
    return True


def start_on_head(spec: dict) -> dict:
    """`start`: the run's lock taken and its supervisor started on this (the head) machine; what the
    front end needs to follow it. AlreadySupervised when one is live."""
    from launcher.follow import launch_count
    from launcher.supervised import ThisMachine, request_of

    home = Path(os.environ[LOCAL_HOME_ENV])
    contract_path = write_contract(home, spec["contract"])
    sys.argv[0] = spec["program"]  # the lock's refusal names the commands the operator types
    request = request_of(spec["request"])
    operator_spec = request.cluster_spec
    request = replace(request, cluster_spec=str(contract_path), rerun=request.rerun_command)
    # Its messages name the --cluster the operator typed, not the head's file (the supervisor inherits it).
    os.environ[OPERATOR_CLUSTER_ENV] = json.dumps({"here": str(contract_path), "typed": operator_spec})
    if spec.get("config_text") is not None:  # --config is a file on the operator's machine: its text travels
        config = home / "configs" / f"{request.run}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(spec["config_text"])
        request = replace(request, config=str(config))
    directory = RunRecord.of(load_cluster(str(contract_path)), request.run).made()
    lock = take_lock(directory, request.run, operator_spec)
    try:
        launches = launch_count(directory)
        state_path(directory).unlink(missing_ok=True)  # the last supervisor's end is not this one's
        start = log_size(directory / LOG_NAME)
        pid = ThisMachine(spec["entry"]).start(request, directory, lock)
        if read_state(directory) is None:  # its pid at once: a second train's refusal names it
            write_state(directory, SupervisorState(pid, STARTING, log_start=start, rerun=request.rerun_command))
    finally:
        os.close(lock)  # the supervisor holds it now
    return {"pid": pid, "directory": str(directory), "launches": launches}


def sync_on_head(directory: Path, offsets: dict[str, int]) -> dict:
    """`sync`: every file of the record from the offset given (whole for WHOLE_SUFFIXES, and where it
    shrank), base64; whether the supervisor is live; and `more` when a file had more than SYNC_CHUNK
    to bring. Not a plot: the operator's machine draws its own.

    The supervisor appends the run's end event, then writes its state. So liveness and the state are
    read first, the directory listed and the files read after, and the state is left out of an answer
    that leaves part of a file for the next sync: a state that comes, comes with everything written
    before it. Read the other way, an end between two reads gave a copy that had ended without its
    end event, and a front end stops copying at the end."""
    live = is_live(directory)
    try:
        state: bytes | None = (directory / STATE_NAME).read_bytes()
    except OSError:
        state = None
    files, more = {}, False
    for path in sorted(directory.iterdir()) if directory.is_dir() else ():
        if path.name in (LOCK_NAME, PLOT_NAME, STATE_NAME) or not path.is_file() or path.name.startswith("."):
            continue
        size, whole = path.stat().st_size, path.name.endswith(WHOLE_SUFFIXES)
        start = offsets.get(path.name, 0)
        if whole or start > size:
            start = 0
        elif start == size:
            continue
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read() if whole else f.read(SYNC_CHUNK)  # a file rewritten in place comes whole
        more |= not whole and len(data) == SYNC_CHUNK
        files[path.name] = {"from": start, "data": base64.b64encode(data).decode()}
    if state is not None and not more:
        files[STATE_NAME] = {"from": 0, "data": base64.b64encode(state).decode()}
    return {"live": live, "files": files, "more": more}


def record_on_head(run: str) -> Path:
    """The run's record directory under the head's supervisor home (made or not)."""
    contract = Path(os.environ[LOCAL_HOME_ENV]) / CONTRACT_NAME
    return RunRecord.of(load_cluster(str(contract)), run).directory


def head_main(argv: list[str]) -> int:
    """The head's side: `python -m launcher.head_node start|sync|interrupt|revived ...` (JSON on stdout)."""
    command = argv[0]
    try:
        if command == "start":
            answer: object = start_on_head(json.loads(sys.stdin.read()))
        elif command == "sync":
            answer = sync_on_head(record_on_head(argv[1]), json.loads(argv[2]))
        elif command == "interrupt":
            answer = interrupt(record_on_head(argv[1]))
        elif command == "revived":
            answer = revived_on_head(argv[1], json.loads(sys.stdin.read()))
        else:
            raise SystemExit(f"unknown command {command!r}")
    except TaskError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(head_main(sys.argv[1:]))
