"""The Dask scheduler a sweep runs on: a local one by name, or a ``dask.distributed``
scheduler reached at its address or through its scheduler file, its versions checked."""

from __future__ import annotations

import contextlib
import os
import re
import socket
from typing import TYPE_CHECKING

from .._errors import InputError
from .._text import one_line, shown

if TYPE_CHECKING:
    from distributed import Client

SCHEDULERS = ("processes", "threads", "synchronous")
"""The local Dask schedulers ``scheduler=`` names; anything else must be ``tcp://HOST:PORT``."""
CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a ``dask.distributed`` scheduler before giving up."""
_ADDRESS_RE = re.compile(r"(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})", re.ASCII)


def _check_scheduler(scheduler: object) -> str | Client:
    if scheduler is None:  # Dask's convention, as Client() has it, else every local core
        from_env = os.environ.get("DASK_SCHEDULER_ADDRESS", "").strip()
        if not from_env:
            return "processes"
        try:
            return _check_scheduler(from_env)
        except InputError as exc:
            raise InputError(f"DASK_SCHEDULER_ADDRESS: {exc}") from None
    if not isinstance(scheduler, str):
        if type(scheduler).__name__ == "Client" and hasattr(scheduler, "submit"):
            return scheduler
        raise TypeError(
            f"scheduler must be a string or a dask.distributed Client, got {shown(scheduler)}"
        )
    text = scheduler.strip()
    if text in SCHEDULERS:
        return text
    if "://" in text:
        match = _ADDRESS_RE.fullmatch(text)
        if match is None or not 0 < int(match.group(3)) < 65536:
            raise InputError(
                f"invalid scheduler address {shown(scheduler)}: expected tcp://HOST:PORT with "
                "a port from 1 to 65535, such as tcp://127.0.0.1:8786"
            )
        return text
    raise InputError(
        f"unknown scheduler {shown(scheduler)}: give processes, threads, synchronous or the "
        "address of a dask.distributed scheduler, tcp://HOST:PORT"
    )


def _connect(address: str, timeout: float) -> Client:
    try:
        from distributed import Client
    except ImportError:
        raise ImportError(
            f"--scheduler {address} needs dask.distributed: pip install 'accelrt[sweep]'",
            name="distributed",
        ) from None
    try:
        if address.startswith("tcp://"):
            _check_dask_answers(address, timeout)
        return Client(address, timeout=timeout, set_as_default=False)
    except _NotAScheduler:
        raise
    except (OSError, TimeoutError):
        raise ConnectionError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s; check the "
            "address, or start one there with `dask scheduler`"
        ) from None


def _connect_file(path: str, timeout: float) -> Client:
    """A ``Client`` of the scheduler a ``--scheduler-file`` JSON names."""
    from distributed import Client

    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"scheduler file {path!r} does not exist; `dask scheduler --scheduler-file PATH` "
            "writes it"
        )
    try:
        return Client(scheduler_file=path, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError):
        raise ConnectionError(
            f"cannot reach the Dask scheduler that {path!r} names within {timeout:g} s"
        ) from None


def _check_versions(client: Client) -> None:
    """Refuse a cluster whose scheduler or workers run other versions than this client."""
    try:
        client.get_versions(check=True, packages=["accelrt"])
    except ValueError as exc:
        raise InputError(
            f"the Dask scheduler or workers at {client.scheduler.address} run other versions "
            f"than this client; install the same ones there: {one_line(str(exc))}"
        ) from None


class _NotAScheduler(ConnectionError):
    """Something answered at a scheduler address, but not a Dask scheduler."""


def _check_dask_answers(address: str, timeout: float) -> None:
    """Refuse, within ``timeout`` seconds, a ``tcp://`` address where no Dask scheduler listens.

    A Dask scheduler sends its handshake (a framed msgpack map naming ``pickle-protocol``) as
    soon as it accepts a connection; ``Client`` waits for it without a limit, so another server
    there (the dashboard's HTTP port, 8787, is the usual mistake) hung the sweep for ever.

    Raises
    ------
    OSError
        If nothing accepts the connection within ``timeout`` (the caller's message).
    _NotAScheduler
        A ``ConnectionError``: something answered but is not a Dask scheduler; the message
        names the address and what answered.
    """
    match = _ADDRESS_RE.fullmatch(address)
    assert match is not None  # checked by _check_scheduler
    host, port = match.group(2).strip("[]"), int(match.group(3))
    asking = min(1.0, timeout / 4)  # the end of the timeout: to ask a silent server what it is
    with socket.create_connection((host, port), timeout=timeout - asking) as probe:
        try:
            first = probe.recv(256)
        except TimeoutError:
            first = None
        if first is not None and b"pickle-protocol" in first:
            return
        if first is None:  # silent: ask it as an HTTP client would, to say what it is
            probe.settimeout(asking)
            with contextlib.suppress(OSError):
                probe.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
                first = probe.recv(256)
    if first and first.startswith(b"HTTP/"):
        status = first.split(b"\r\n", 1)[0].decode("ascii", "backslashreplace")
        what = f"an HTTP server answered ({status!r}): the Dask dashboard listens on 8787"
    elif first:
        what = f"something answered with {first[:32]!r}, not Dask's handshake"
    else:
        what = f"something accepted the connection but sent nothing within {timeout:g} s"
    raise _NotAScheduler(
        f"{address} is not a Dask scheduler: {what}; give the scheduler's own address "
        "(tcp://HOST:8786 by default, printed by `dask scheduler`)"
    )
