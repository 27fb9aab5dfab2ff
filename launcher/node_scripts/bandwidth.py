"""Node-to-node bandwidth, standard library only: one run per node, all at once, in a ring.

    python - IP PORT NEXT_IP SECONDS LIMIT < bandwidth.py

Listens on this node's private address IP:PORT for one sender (the previous node of the ring),
and meanwhile sends zeros to NEXT_IP:PORT for SECONDS (retrying the connection until the next
node listens). Prints "sent BYTES" and "received BYTES SECONDS": the middle 80% of what arrived
and how long it took, the previous node's egress. Every node sends and receives at once, as the
ranks of a ring all-reduce do. The process ends itself after LIMIT seconds whatever happens
(SIGALRM), so nothing it starts outlives the check.

    python - nccl MASTER_IP PORT RANK WORLD SECONDS LIMIT [INTERFACE] < bandwidth.py

The same ring over NCCL on GPU nodes, with the node environment's torch (imported only here): one
rank per node on cuda:0, rank 0's store at MASTER_IP:PORT, NCCL's sockets on INTERFACE (the private
address's, as the ranks' env.sh names it). Each round sends a GPU tensor to the next rank while
receiving one from the previous (batch_isend_irecv); every rank runs the same number of rounds, as
many as the slowest link moves in SECONDS, and prints the same two lines.
"""

import os
import signal
import socket
import sys
import threading
import time

CHUNK = 1 << 20
NCCL_MESSAGE = 32 << 20
"""Bytes of each NCCL round: ~3 ms at 100 Gbit/s, ~0.3 s at 1 Gbit/s."""


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


def nccl_main(master_ip: str, port: int, rank: int, world: int, seconds: float, limit: float, interface: str) -> int:
    signal.alarm(int(limit) + 1)
    if interface:
        os.environ["NCCL_SOCKET_IFNAME"] = interface
    try:
        import datetime

        import torch
        import torch.distributed as dist
    except Exception as e:
        print(f"import torch failed: {type(e).__name__}: {e}", flush=True)
        return 1
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print(f"torch {torch.__version__} has no GPU or no NCCL here: fix the GPU checks first", flush=True)
        return 1
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://{master_ip}:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=limit / 3),  # a missing peer fails before the alarm
        )
        send = torch.zeros(NCCL_MESSAGE, dtype=torch.uint8, device=device)
        received = torch.empty_like(send)
        following, previous = (rank + 1) % world, (rank - 1) % world

        def rounds(count: int) -> float:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(count):
                ops = [dist.P2POp(dist.isend, send, following), dist.P2POp(dist.irecv, received, previous)]
                for request in dist.batch_isend_irecv(ops):
                    request.wait()
            torch.cuda.synchronize()
            return time.perf_counter() - start

        rounds(1)  # NCCL connects the ring at the first exchange
        once = rounds(1)
        # Every rank must post as many rounds as its peers: the count the slowest rank can afford.
        count = torch.tensor([max(1, min(1000, int(seconds / max(once, 1e-6))))], device=device)
        dist.all_reduce(count, op=dist.ReduceOp.MIN)
        elapsed = rounds(int(count.item()))
        dist.destroy_process_group()
    except Exception as e:  # NCCL's errors arrive as RuntimeError / DistBackendError with the cause in the text
        message = str(e).strip().splitlines()
        print(f"NCCL: {type(e).__name__}: {message[0] if message else 'no message'}", flush=True)
        return 1
    total = int(count.item()) * NCCL_MESSAGE
    print(f"sent {total}", flush=True)
    print(f"received {total} {elapsed:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    a = sys.argv
    if a[1] == "nccl":
        interface = a[8] if len(a) > 8 else ""
        sys.exit(nccl_main(a[2], int(a[3]), int(a[4]), int(a[5]), float(a[6]), float(a[7]), interface))
    sys.exit(main(a[1], int(a[2]), a[3], float(a[4]), float(a[5])))
