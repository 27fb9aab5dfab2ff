"""The head node's side of a run supervised there (a VM cluster's rank 0 machine), so the run outlives
the operator's machine: a closed laptop or a lost network leaves it restarting, budgeted and recorded to
its end. The operator's side sends these commands over SSH and follows the run (launcher.head_watch):

    start      the cluster as the head sees it (the contract, with the head reached at its private
               address) written to SUPERVISOR_HOME/cluster.json; the run's lock taken in the head's
               record directory (a second train of a live run refuses, as on this machine); the
               supervisor started as ThisMachine starts one (its own session, stdin /dev/null, output to
               the run's log), so it survives the SSH session closing; the request it was started
               with kept in the record, for a front end that resumes the run after the head was lost
               (launcher.head_heal)
    follow     one process for as long as the operator follows the run: a JSON line each time the
               record's files grew or changed (from the offsets the operator's copy has reached), and
               whether the supervisor is live; it ends once the supervisor has ended and its last
               state was sent, when the operator is gone, or after FOLLOW_S (the operator's side
               starts the next from its offsets: launcher.head_stream)
    interrupt  Ctrl-C for the run: SIGINT to the head's live supervisor
    revived    a Pulumi stack's lost VMs revived by the front end (the head holds no cloud credentials):
               the stack's contract read again, and the answer the supervisor waits for
               (launcher.recover.front_end_revival)

`follow` runs on the head for as long as someone follows the run, beside rank 0's training. A command
per look (a `sync` once a second, before) cost 0.12 to 0.14 CPU-s a second there, a Python process
started each time; one process that looks at the record once a second (a lock probe, a listing, a
stat per file) costs 0.13 CPU-s to start, then about 0.0005 CPU-s a second (a log appended to ten
times a second): under 0.001 a second over a FOLLOW_S. This module imports only what these commands
use (not Fabric, the run kinds or the tasks: they tripled a start); `start` imports the supervisor's
modules itself.

How a follow finds the operator gone: by writing. It writes a line at least every HEARTBEAT_S, changed
or not, and a closed SSH session breaks its stdout (the write fails, it exits); a write that blocks
(an operator that stopped reading) is ended by SIGALRM at FOLLOW_S + STALL_S, which bounds its life.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from launcher.cluster.contract import OPERATOR_CLUSTER_ENV, load_cluster
from launcher.cluster.local import LOCAL_HOME_ENV
from launcher.console import TaskError
from launcher.launch.supervisor import (
    LOCK_NAME,
    STARTING,
    STATE_NAME,
    AlreadySupervised,
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
UNKNOWN_COMMAND = "unknown command"
"""What head_main answers (on stderr, exit 1) to a command it does not know, as every version has."""
ALREADY_SUPERVISED_EXIT = 75
"""`start`'s exit status where the run's supervisor is live (its lock held), its line the lock's refusal:
a front end that resumes the run follows that one instead (launcher.head_heal)."""
SYNC_CHUNK = 4 << 20
"""Bytes of one file a line of `follow` brings at most (a long log arrives over several lines)."""
WHOLE_SUFFIXES = (".json",)
"""Files rewritten in place (supervisor.json): copied whole when they changed; the rest are appended to."""
POLL_S = 1.0
"""Between two looks of `follow` at the record (a lock probe, a listing, a stat per file)."""
HEARTBEAT_S = 5.0
"""`follow` writes a line at least this often: a write is how it finds the operator gone, and a silence
how the operator's side finds the head gone (launcher.head_stream.STREAM_IDLE_S)."""
FOLLOW_S = 600.0
"""How long one `follow` lasts; the operator's side then starts the next from its offsets (a Python
start every 10 minutes, not every second). Bounds how long a head that went silent holds a follower."""
STALL_S = 60.0
"""A `follow` still there FOLLOW_S + STALL_S after it started (a write blocked: nobody reads) is ended by
SIGALRM; the operator's side gives up on a stream at the same bound."""


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
    from launcher.head_heal import write_request
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
        # What a front end that finds this supervisor gone resumes the run with (launcher.head_heal).
        write_request(directory, spec["request"], spec.get("config_text"))
        launches = launch_count(directory)
        state_path(directory).unlink(missing_ok=True)  # the last supervisor's end is not this one's
        start = log_size(directory / LOG_NAME)
        pid = ThisMachine(spec["entry"]).start(request, directory, lock)
        if read_state(directory) is None:  # its pid at once: a second train's refusal names it
            write_state(directory, SupervisorState(pid, STARTING, log_start=start, rerun=request.rerun_command))
    finally:
        os.close(lock)  # the supervisor holds it now
    return {"pid": pid, "directory": str(directory), "launches": launches, "log_start": start}


@dataclass
class Look:
    """What one look at the head's record found to send (changes())."""

    live: bool
    """Whether the supervisor holds the run's lock."""
    files: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """Each file's part: the offset it starts at in the head's file, its bytes."""
    more: bool = False
    """Whether a file had more than SYNC_CHUNK to bring (the state then waits for the next look)."""

    def line(self, number: int) -> bytes:
        """The line `follow` writes: JSON, the parts base64, numbered (`n`: a line lost in between shows)."""
        files = {
            name: {"from": start, "data": base64.b64encode(data).decode()} for name, (start, data) in self.files.items()
        }
        return json.dumps({"n": number, "live": self.live, "files": files, "more": self.more}).encode() + b"\n"


def changes(directory: Path, offsets: dict[str, int], sent: dict[str, bytes]) -> Look:
    """One look at the record: every file from its offset (whole for WHOLE_SUFFIXES, and where it
    shrank) that grew or, rewritten in place, differs from what was sent (sent: the bytes last sent
    of each); whether the supervisor is live; and `more` when a file had more than SYNC_CHUNK to bring.
    Not a plot: the operator's machine draws its own.

    The supervisor appends the run's end event, then writes its state. So liveness and the state are
    read first, the directory listed and the files read after, and the state is left out of a look
    that leaves part of a file for the next: a state that comes, comes with everything written before
    it. Read the other way, an end between two reads gave a copy that had ended without its end event,
    and a front end stops copying at the end."""
    live = is_live(directory)
    try:
        state: bytes | None = (directory / STATE_NAME).read_bytes()
    except OSError:
        state = None
    look = Look(live)
    for path in sorted(directory.iterdir()) if directory.is_dir() else ():
        if path.name in (LOCK_NAME, PLOT_NAME, STATE_NAME) or not path.is_file() or path.name.startswith("."):
            continue
        if path.name.endswith(WHOLE_SUFFIXES):
            data = path.read_bytes()
            if sent.get(path.name) != data:
                look.files[path.name] = (0, data)
            continue
        size, start = path.stat().st_size, offsets.get(path.name, 0)
        if start > size:
            start = 0
        elif start == size:
            continue
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(SYNC_CHUNK)
        look.more |= len(data) == SYNC_CHUNK
        look.files[path.name] = (start, data)
    if state is not None and not look.more and sent.get(STATE_NAME) != state:
        look.files[STATE_NAME] = (0, state)
    return look


def follow_on_head(directory: Path, offsets: dict[str, int], out: BinaryIO) -> None:
    """`follow`: a line (Look.line) each time the record changed, and at least every HEARTBEAT_S; at
    once while a file has more to bring, else a look every POLL_S. It returns once the supervisor is
    not live and the line with the rest of its record was written (the last line), once out is closed
    (the operator gone), or after FOLLOW_S."""
    deadline = time.monotonic() + FOLLOW_S
    sent: dict[str, bytes] = {}
    written, last_write = 0, 0.0
    while True:
        look = changes(directory, offsets, sent)
        last = not look.live and not look.more
        if look.files or last or written == 0 or time.monotonic() - last_write >= HEARTBEAT_S:
            try:
                out.write(look.line(written))
                out.flush()
            except OSError:  # a broken pipe: the SSH session closed
                return
            written, last_write = written + 1, time.monotonic()
            for name, (start, data) in look.files.items():
                if name.endswith(WHOLE_SUFFIXES):  # supervisor.json among them
                    sent[name] = data
                else:
                    offsets[name] = start + len(data)
        if last or time.monotonic() >= deadline:
            return
        if not look.more:
            time.sleep(POLL_S)


def record_on_head(run: str) -> Path:
    """The run's record directory under the head's supervisor home (made or not)."""
    contract = Path(os.environ[LOCAL_HOME_ENV]) / CONTRACT_NAME
    return RunRecord.of(load_cluster(str(contract)), run).directory


def head_main(argv: list[str]) -> int:
    """The head's side: `python -m launcher.head_node start|follow|interrupt|revived ...` (JSON on stdout:
    one answer, or follow's lines)."""
    command = argv[0]
    try:
        if command == "start":
            answer: object = start_on_head(json.loads(sys.stdin.read()))
        elif command == "follow":
            signal.alarm(int(FOLLOW_S + STALL_S))
            follow_on_head(record_on_head(argv[1]), json.loads(argv[2]), sys.stdout.buffer)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush to a closed pipe
            return 0
        elif command == "interrupt":
            answer = interrupt(record_on_head(argv[1]))
        elif command == "revived":
            answer = revived_on_head(argv[1], json.loads(sys.stdin.read()))
        else:
            raise SystemExit(f"{UNKNOWN_COMMAND} {command!r}")
    except AlreadySupervised as e:
        print(str(e), file=sys.stderr)
        return ALREADY_SUPERVISED_EXIT
    except TaskError as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(head_main(sys.argv[1:]))
