"""Checks, before any rank starts, that the exporter's ports are free (one line and exit 2
instead of a rank failing mid-start)."""

from __future__ import annotations

import socket

from dayzero.errors import DayzeroError


class PortError(DayzeroError):
    """A metrics port is out of range or taken."""


def check_ports(port: int, count: int, local_rank: int | None = None, aggregate: bool = False) -> None:
    """Ports ``port .. port + count - 1`` (or only ``port + local_rank`` for one rank of a torchrun
    job; rank 0 alone with ``aggregate``) must be bindable."""
    if local_rank is not None:
        if aggregate and local_rank != 0:
            return
        ports = [port + (0 if aggregate else local_rank)]
    else:
        ports = list(range(port, port + count))
    if ports[-1] > 65535:
        raise PortError(f"--metrics-port {port}: {count} rank(s) need ports up to {ports[-1]}, past 65535")
    for p in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # as the exporter's server binds (prometheus_client serves through http.server, whose
            # allow_reuse_address sets SO_REUSEADDR): a port left in TIME_WAIT by the previous run is
            # free to it, a port another process listens on is not (Linux refuses that bind either way)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", p))
            except OSError as e:
                raise PortError(f"--metrics-port {port}: port {p} is taken ({e.strerror or e}); rank r serves on "
                                "PORT + its local rank, so choose a free range") from None


def free_port_range(count: int, start: int = 20000, end: int = 60000) -> int:
    """The first ``port`` from ``start`` with ``count`` consecutive free ports (tests, benchmarks)."""
    p = start
    while p + count <= end:
        try:
            check_ports(p, count)
            return p
        except PortError:
            p += count
    raise PortError(f"no {count} consecutive free ports between {start} and {end}")
