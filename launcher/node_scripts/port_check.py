"""Rendezvous port check between nodes, standard library only.

python - listen IP PORT COUNT TIMEOUT < port_check.py   # prints "listening", then one line per peer
python - connect IP PORT TIMEOUT < port_check.py        # exit 0 when the head accepted us
"""

import socket
import sys


def listen(ip: str, port: int, count: int, timeout: float) -> int:
    server = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((ip, port))
    except OSError as e:
        print(f"cannot listen on {ip}:{port}: {e.strerror}", flush=True)
        return 1
    server.listen(count)
    server.settimeout(timeout)
    print("listening", flush=True)
    for _ in range(count):
        try:
            conn, peer = server.accept()
        except TimeoutError:
            return 0
        print(f"accepted {peer[0]}", flush=True)
        conn.close()
    return 0


def connect(ip: str, port: int, timeout: float) -> int:
    try:
        socket.create_connection((ip, port), timeout=timeout).close()
    except OSError as e:
        print(f"cannot connect to {ip}:{port}: {e.strerror or e}")
        return 1
    return 0


if __name__ == "__main__":
    mode, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "listen":
        sys.exit(listen(ip, port, int(sys.argv[4]), float(sys.argv[5])))
    sys.exit(connect(ip, port, float(sys.argv[4])))
