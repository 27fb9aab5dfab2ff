"""Node-to-node bandwidth, standard library only: one run per node, all at once, in a ring.

    python - IP PORT NEXT_IP SECONDS LIMIT < bandwidth.py

Listens on this node's private address IP:PORT for one sender (the previous node of the ring),
and meanwhile sends zeros to NEXT_IP:PORT for SECONDS (retrying the connection until the next
node listens). Prints "sent BYTES" and "received BYTES SECONDS": the middle 80% of what arrived
and how long it took, the previous node's egress. Every node sends and receives at once, as the
ranks of a ring all-reduce do. The process ends itself after LIMIT seconds whatever happens
(SIGALRM), so nothing it starts outlives the check.
"""

import signal
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def receive(server: socket.socket, limit: float, result: dict) -> None:
    server.settimeout(limit)
    try:
        conn, _ = server.accept()
    except OSError as e:
        result["error"] = f"no sender connected: {e}"
        return
    conn.settimeout(limit)
    arrivals = []  # (time, bytes so far) after each read
    total, buffer = 0, bytearray(CHUNK)
    with conn:
        while True:
            n = conn.recv_into(buffer)
            if not n:
                break
            total += n
            arrivals.append((time.perf_counter(), total))
    # The rate between the arrival of the first 10% and of 90% of the bytes: without TCP's slow
    # start and a token bucket's burst at the start, or a read delayed at the end on a busy machine.
    start = next((a for a in arrivals if a[1] >= 0.1 * total), None)
    end = next((a for a in arrivals if a[1] >= 0.9 * total), None)
    if start is None or end is None or end[0] <= start[0]:
        result["bytes"], result["seconds"] = 0, 0.0
    else:
        result["bytes"], result["seconds"] = end[1] - start[1], end[0] - start[0]


def send(ip: str, port: int, seconds: float, deadline: float) -> int:
    while True:
        try:
            conn = socket.create_connection((ip, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    payload, sent = bytes(CHUNK), 0
    with conn:
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            conn.sendall(payload)
            sent += CHUNK
    return sent


def main(ip: str, port: int, next_ip: str, seconds: float, limit: float) -> int:
    signal.alarm(int(limit) + 1)  # the hard bound: SIGALRM ends the process
    server = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((ip, port))
    except OSError as e:
        print(f"cannot listen on {ip}:{port}: {e.strerror}", flush=True)
        return 1
    server.listen(1)
    result: dict = {}
    receiver = threading.Thread(target=receive, args=(server, limit, result), daemon=True)
    receiver.start()
    try:
        sent = send(next_ip, port, seconds, time.monotonic() + limit / 2)
    except OSError as e:
        print(f"cannot send to {next_ip}:{port}: {e.strerror or e}", flush=True)
        return 1
    print(f"sent {sent}", flush=True)
    receiver.join(limit)
    server.close()
    if "error" in result or "bytes" not in result:
        print(result.get("error", "nothing received in time"), flush=True)
        return 1
    print(f"received {result['bytes']} {result['seconds']:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    a = sys.argv
    sys.exit(main(a[1], int(a[2]), a[3], float(a[4]), float(a[5])))
