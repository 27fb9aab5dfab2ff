"""Report the kernel's OOM kills on this node around a time, as one Python literal line:

    python -S - SINCE UNTIL < oom_record.py

SINCE and UNTIL are Unix times. The answer: {"killed": [[pid, command, unix_time], ...] for every
"Killed process PID (COMMAND)" the kernel logged in that window (its global OOM killer and a
cgroup's alike: "Out of memory: Killed process ..." / "Memory cgroup out of memory: Killed process
..."), "readable": whether the kernel log could be read (reading /dev/kmsg needs root or
kernel.dmesg_restrict=0), "oom_kills": /proc/vmstat's count of OOM kills since boot, which anyone
may read (the launcher compares it with the count the probe saw at launch).

Test seam: NANOCLUSTER_OOM_LOG, when set, names a file read instead of /dev/kmsg, in /dev/kmsg's
record format ("PRIORITY,SEQ,MICROSECONDS_SINCE_BOOT,FLAGS;MESSAGE", the clock CLOCK_MONOTONIC).
"""

import os
import sys
import time

KMSG = "/dev/kmsg"
SEAM_ENV = "NANOCLUSTER_OOM_LOG"
MARKER = "Killed process "


def records(path: str) -> list[tuple[int, str]]:
    """The kernel log's records as (microseconds since boot, message); [] when unreadable."""
    if path != KMSG:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    else:  # /dev/kmsg hands out one record per read and EAGAIN at the end of the buffer
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
        lines = []
        try:
            while True:
                try:
                    lines.append(os.read(fd, 8192).decode(errors="replace").rstrip("\n"))
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: a record overwritten while reading; go on with the next
                    continue
        finally:
            os.close(fd)
    found: list[tuple[int, str]] = []
    for line in lines:
        header, _, message = line.partition(";")
        fields = header.split(",")
        if len(fields) >= 3 and fields[2].isdigit():
            found.append((int(fields[2]), message))
    return found


def killed(since: float, until: float, path: str) -> list[list[int | str | float]]:
    """[pid, command, unix time] of every OOM kill the log holds between since and until."""
    boot = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)  # the log's clock, as Unix time
    out: list[list[int | str | float]] = []
    for micros, message in records(path):
        at = boot + micros / 1e6
        if MARKER not in message or not since <= at <= until:
            continue
        rest = message.split(MARKER, 1)[1]
        pid, _, tail = rest.partition(" ")
        command = tail[1 : tail.find(")")] if tail.startswith("(") else ""
        if pid.isdigit():
            out.append([int(pid), command, round(at, 3)])
    return out


def oom_kills() -> int | None:
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def main() -> None:
    since, until = float(sys.argv[1]), float(sys.argv[2])
    path = os.environ.get(SEAM_ENV) or KMSG
    try:
        found, readable = killed(since, until, path), True
    except OSError:
        found, readable = [], False
    print(repr({"killed": found, "readable": readable, "oom_kills": oom_kills()}))


if __name__ == "__main__":
    main()
