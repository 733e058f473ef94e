"""Start a private Ray, or join a cluster without ever hanging.

* No address: ``ray.init(address="local")`` — always a new, private instance. A bare ``ray.init()``
  would attach to whatever cluster Ray's ``ray_current_cluster`` file names, and hang if it is gone.
* An address (``HOST:PORT``, ``auto``, or ``RAY_ADDRESS``): resolve it, check that the head's port
  answers within ``ray_connect_timeout_s``, then ``ray.init`` (which itself has no timeout).

Token authentication (on by default since Ray 2.5x) stays on: a private Ray uses the token in
``~/.ray/auth_token`` (Ray writes it on first use), and a driver joining a cluster must run with the same
``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN_PATH`` as the cluster's nodes. Ray's servers listen on all
interfaces; the token is what keeps other hosts from running code on them. We only silence Ray's
"token authentication is enabled" start-up warning — never the authentication.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import time
from typing import Any

from herdrl.errors import HerdError

_AUTH_WARNING_LOGGER = "ray._private.authentication.authentication_token_setup"
_connected_here = False


class ClusterError(HerdError):
    """A Ray cluster cannot be started or reached."""


class _DropAuthEnabledWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Token authentication is enabled for this Ray cluster" not in record.getMessage()


def _quiet_auth_warning() -> None:
    logger = logging.getLogger(_AUTH_WARNING_LOGGER)
    if not any(isinstance(f, _DropAuthEnabledWarning) for f in logger.filters):
        logger.addFilter(_DropAuthEnabledWarning())


def resolve_address(address: str) -> str:
    """``auto`` -> the cluster the last ``ray start`` on this machine recorded; other addresses unchanged.

    Unlike Ray's own ``auto``, this never falls back to "any Ray process found on the host": on a shared
    machine that attaches to somebody else's cluster (seen here). A recorded head that has since died is
    caught by :func:`wait_for_port`.
    """
    if address != "auto":
        return address
    from ray._private.utils import read_ray_address

    found = read_ray_address()
    if not found:
        raise ClusterError("--address auto found no cluster started on this machine (no ray_current_cluster file); "
                           "start one with `ray start --head` or give --address HOST:PORT")
    return found


def wait_for_port(address: str, timeout_s: float) -> None:
    """Return once ``HOST:PORT`` accepts TCP connections; ClusterError after ``timeout_s``."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ClusterError(f"bad Ray address '{address}': expected HOST:PORT or auto")
    deadline = time.monotonic() + timeout_s
    last_error: OSError | None = None
    while True:
        try:
            with socket.create_connection((host, int(port_text)), timeout=min(2.0, timeout_s)):
                return
        except OSError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise ClusterError(
                f"Ray head at {address} did not answer within {timeout_s:g} s ({last_error}); "
                "check the address and that the head is running, or raise ray_connect_timeout_s")
        time.sleep(0.25)


#: The HTTP/2 connection preface and an empty SETTINGS frame: a gRPC server (a Ray head's GCS) answers with a
#: SETTINGS frame of its own; an HTTP/1 server, or any other service, does not.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def check_speaks_grpc(address: str, timeout_s: float = 10.0) -> None:
    """ClusterError when ``HOST:PORT`` answers as something other than a gRPC server (a Ray head's GCS): Ray
    would otherwise retry a non-Ray service for minutes, printing its C++ client's warnings. Only a definite
    wrong answer fails: a TLS cluster (``RAY_USE_TLS``) is not probed, and a head too busy to answer in time
    is left to ``ray.init``."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    host, _, port = address.rpartition(":")
    reply = b""
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.sendall(_HTTP2_HELLO)
            while len(reply) < 9:
                chunk = sock.recv(9 - len(reply))
                if not chunk:
                    break
                reply += chunk
    except TimeoutError:
        if not reply:
            return  # silent so far: perhaps a loaded head; ray.init decides
    except OSError:
        pass  # reset while talking: judged by what came back
    if len(reply) < 9 or reply[3] != 0x04:  # frame type 4: SETTINGS
        raise ClusterError(f"{address} answers, but not as a Ray head (no gRPC reply): check the address and "
                           "port (the head's GCS port, 6379 unless changed)")


_TOKEN_HINT = "run with the same RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH as its nodes"


def check_token_accepted(address: str, timeout_s: float = 5.0) -> None:
    """ClusterError at once when the head's GCS refuses this process's token, or its lack of one: ``ray.init``
    retries for ~20 s before it gives up with a message that does not say why. One cheap call
    (``GetClusterId``), with the token ``ray.init`` would send and, as Ray's own channels, past any HTTP proxy.
    Not probed: a TLS cluster (``RAY_USE_TLS``), and token mode without a token (``ray.init`` says so itself);
    any answer but "unauthenticated", or none, is left to ``ray.init``."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    try:
        import grpc
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
        from ray._private.authentication.grpc_authentication_client_interceptor import (
            _get_authentication_metadata_tuple,
        )

        token_mode = is_token_auth_enabled()
        metadata = _get_authentication_metadata_tuple() if token_mode else ()
    except Exception:  # (Ray's private helpers moved, or its token file is unreadable: ray.init will say)
        return
    if token_mode and not metadata:
        return
    try:
        with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:
            get_cluster_id = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")  # bytes in and out
            get_cluster_id(b"", timeout=timeout_s, metadata=metadata)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            sent = "a token it does not accept" if metadata else "no token (RAY_AUTH_MODE is not token here)"
            raise ClusterError(f"the Ray cluster at {address} uses token auth and this process sent {sent}: "
                               f"{_TOKEN_HINT}") from exc
    except Exception:  # anything else is ray.init's to find
        return


def check_fits_one_node(wants: dict[str, tuple[str, float]], where: str) -> None:
    """Raise :class:`ClusterError` when one actor's reservation (config key -> (Ray resource, amount)) is more than
    the largest alive node of the connected Ray offers: Ray reserves an actor's resources on one node, so it could
    never be placed, however much the whole cluster has (a placement group would wait for it, then time out).
    ``where``: the cluster, as the message names it ("the Ray cluster at HOST:PORT"). A resource no node has at all
    is left to the caller's check of the cluster's totals (its message says that)."""
    import ray

    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    for key, (resource, want) in wants.items():
        largest = max((node.get(resource, 0.0) for node in nodes), default=0.0)
        if 0 < largest < want:
            raise ClusterError(f"{key}={want:g} is more than the largest node of {where} offers ({largest:g} "
                               f"{resource}): a runner's {resource} is reserved on one node, so no runner could "
                               f"ever be placed; set {key} to {largest:g} or less, or add a node with {want:g} "
                               f"{resource}")


def connect(config: Any, num_cpus: float | None = None) -> bool:
    """Make sure this process is connected to Ray as ``config`` asks; no-op when it already is.

    Returns True when this call started or joined Ray (the caller then owns it: :func:`disconnect`).

    ``num_cpus``: CPUs a private Ray must offer (at least this machine's count), so every runner
    the user asked for gets scheduled even when there are more runners than cores.
    """
    global _connected_here
    import ray

    _quiet_auth_warning()
    if ray.is_initialized():
        # Ray takes a job's runtime_env at ray.init only: where herdrl did not start or join this Ray (a ray.init
        # of the user's own), the runtime_env is said to be dropped, not dropped silently
        if config.runtime_env and not _connected_here:
            logging.getLogger("herdrl").warning(
                "herdrl: runtime_env is not applied: Ray was started in this process before herdrl connected (a "
                "ray.init of your own); give runtime_env to that ray.init instead")
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not sys.stderr.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # a log file gets no ANSI colour codes from Ray's prefixes
    address = config.address or os.environ.get("RAY_ADDRESS") or None
    if address == "auto" and os.environ.get("RAY_ADDRESS", "auto") != "auto":
        address = os.environ["RAY_ADDRESS"]  # as Ray does: RAY_ADDRESS names the cluster `auto` means
    common: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if config.node_ip_address:
        common["_node_ip_address"] = config.node_ip_address
    if config.runtime_env:
        common["runtime_env"] = config.runtime_env
    try:
        if address is None:
            ray.init(address="local", include_dashboard=config.include_dashboard,
                     num_cpus=max(os.cpu_count() or 1, num_cpus or 0), **common)
            _connected_here = True
            return True
        target = resolve_address(address)
        wait_for_port(target, config.ray_connect_timeout_s)
        check_speaks_grpc(target, min(10.0, config.ray_connect_timeout_s))
        check_token_accepted(target, min(5.0, config.ray_connect_timeout_s))
        os.environ["RAY_ADDRESS"] = target  # ray.init prefers RAY_ADDRESS over its argument: make them agree
        ray.init(address=target, **common)
        _connected_here = True
        return True
    except HerdError:
        raise
    except Exception as exc:
        chain, inner = [], exc
        while inner is not None and len(chain) < 10:
            chain.append(f"{type(inner).__name__}: {inner}")
            inner = inner.__cause__ or inner.__context__
        hint = ""
        if any("auth" in text.lower() for text in chain):
            hint = f"; the cluster uses token auth: {_TOKEN_HINT}"
        where = f"join the Ray cluster at {address}" if address else "start Ray"
        raise ClusterError(f"could not {where}: {type(exc).__name__}: {str(exc).splitlines()[0]}{hint}") from exc


def disconnect() -> None:
    """Shut down the private Ray this module started, or leave the cluster it joined; a Ray that was
    already initialised before :func:`connect` (by the user, or a test fixture) is left alone."""
    global _connected_here
    if _connected_here:
        import ray

        ray.shutdown()
        _connected_here = False


def object_store_use() -> dict[str, float]:
    """The cluster's object stores, all nodes together: bytes in use and the fraction of their capacity (result
    rows: ``object_store_bytes``, ``object_store_fraction``); empty without Ray or where this Ray cannot say
    (the figures come from Ray's internal memory-info call, a few ms)."""
    ray = sys.modules.get("ray")  # (an in-process run never imports Ray for this)
    if ray is None or not ray.is_initialized():
        return {}
    try:
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address

        stats = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address)).store_stats
        used, available = float(stats.object_store_bytes_used), float(stats.object_store_bytes_avail)
    except Exception:  # (a private API: another Ray version may lack it; the rows then go without)
        return {}
    return {"object_store_bytes": used, "object_store_fraction": used / available if available > 0 else math.nan}
