"""A node that goes away without a word (powered off, preempted, its network cut) closes nothing: a
stream from it brings nothing and never ends, and paramiko never acts on unanswered keepalives. A stream
given an idle bound ends with an error naming the node once nothing came for that long, on SSH (a
channel that brings nothing, as paramiko's does then) and on the local transport alike; and a shell whose
connection died gives one over a fresh connection rather than retrying the dead one."""

from __future__ import annotations

import time

import pytest

from launcher.cluster.contract import parse_contract
from launcher.transport import NodeError, connect
from launcher.transport.ssh import SSHShell


class Transport:
    """paramiko's Transport as SSHShell uses it: active until it dies; each session a channel of kind."""

    def __init__(self, kind: type) -> None:
        self.kind, self.active = kind, True

    def is_active(self) -> bool:
        return self.active

    def open_session(self, timeout: float | None = None) -> object:
        return self.kind(self)


class Connection:
    """A PinnedConnection as SSHShell uses it: its client's transport, close()."""

    def __init__(self, transport: Transport) -> None:
        self.transport, self.closed = transport, False
        self.client = self

    def get_transport(self) -> Transport:
        return self.transport

    def close(self) -> None:
        self.closed = True


class SilentChannel:
    """A session on a node that went away: each recv waits out the channel's timeout and raises, as
    paramiko's does when nothing comes (no data, no EOF)."""

    closed = False

    def __init__(self, transport: Transport) -> None:
        self.transport, self.timeout = transport, None

    def set_combine_stderr(self, combine: bool) -> None:
        pass

    def settimeout(self, timeout: float) -> None:
        self.timeout = timeout

    def exec_command(self, command: str) -> None:
        pass

    def shutdown_write(self) -> None:
        pass

    def recv(self, size: int) -> bytes:
        assert self.timeout is not None, "a channel without a timeout blocks forever"
        time.sleep(self.timeout)
        raise TimeoutError

    def get_transport(self) -> Transport:
        return self.transport

    def close(self) -> None:
        pass


class AnsweringChannel(SilentChannel):
    """A session whose command prints `ok` and exits 0."""

    def __init__(self, transport: Transport) -> None:
        super().__init__(transport)
        self.unread = b"ok\n"

    def recv_ready(self) -> bool:
        return bool(self.unread)

    def recv(self, size: int) -> bytes:
        data, self.unread = self.unread, b""
        return data

    def recv_stderr_ready(self) -> bool:
        return False

    def exit_status_ready(self) -> bool:
        return True

    def recv_exit_status(self) -> int:
        return 0


@pytest.fixture
def head(contract):
    return parse_contract(contract, "c.json").head


def test_an_ssh_stream_from_a_silent_node_ends_at_its_idle_bound(head):
    shell = SSHShell(head, Connection(Transport(SilentChannel)), lambda: pytest.fail("no fresh connection"))
    with pytest.raises(NodeError, match=r"^lab-0: sent nothing for 0.2 s \(is it down, or its network\?\)$"):
        shell.stream("python -m launcher.head_node follow r {}", lambda line: None, timeout=660, idle_timeout=0.2)


def test_a_shell_whose_connection_died_gives_one_over_a_fresh_connection(head):
    dead = Connection(Transport(AnsweringChannel))
    dead.transport.active = False  # the node rebooted: the transport is gone for good
    fresh: list[Connection] = []

    def opener() -> Connection:
        fresh.append(Connection(Transport(AnsweringChannel)))
        return fresh[-1]

    shell = SSHShell(head, dead, opener)
    with pytest.raises(NodeError, match=r"^lab-0: the SSH connection is closed$"):
        shell.run("true")
    again = shell.reopened()
    assert again.run("true").stdout == "ok\n"
    assert dead.closed and len(fresh) == 1 and again.connection is fresh[0]


def test_a_local_stream_that_says_nothing_ends_at_its_idle_bound_one_that_talks_does_not(local3):
    shell = connect(local3, local3.nodes)[0]
    with pytest.raises(NodeError, match=r"^local0: the command sent nothing for 0.3 s: sleep 30; echo late$"):
        shell.stream("sleep 30; echo late", lambda line: None, idle_timeout=0.3)  # sleep, bash's child, goes too
    lines: list[str] = []
    talking = "for i in 1 2 3 4 5; do echo $i; sleep 0.05; done"
    assert shell.stream(talking, lines.append, idle_timeout=5) == 0
    assert lines == ["1", "2", "3", "4", "5"]
