"""Free ports on 127.0.0.1, for servers and rendezvous the tests start, and whether a server listens on one."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_port() -> int:
    """A port nothing listens on right now (127.0.0.1): the next server may bind it, a connection is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def free_port_block(n: int, attempts: int = 50) -> int:
    """A base port ``p`` with ``p .. p+n-1`` all free on 127.0.0.1 just now (the bridge's Prometheus exporter uses
    base, base+1, ...: the agent, then each local rank)."""
    for _ in range(attempts):
        base = free_port()
        if base + n > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind((HOST, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no block of {n} free ports found")


def listening(port: int) -> bool:
    """Whether a server accepts connections on 127.0.0.1:``port`` now (one attempt, 0.2 s at most)."""
    try:
        socket.create_connection((HOST, port), timeout=0.2).close()
        return True
    except OSError:
        return False
