"""The daemon's wire protocol: frames, the request table and its check (server and client).

Messages are 4-byte big-endian lengths followed by JSON objects. A request names its `op`; the
fields each op takes, with their JSON types, are `REQUESTS`, and `check_request` says what is
wrong with a request, naming the field. The package's docstring draws a call's messages.
"""
from __future__ import annotations

import json
import socket
import struct

from spina.fields import kind_problem

DEFAULT_SOCKET = "/tmp/spina-agent.sock"
MAX_MESSAGE = 1 << 20
_LEN = struct.Struct("!I")


def send_msg(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


class BadMessage(ValueError):
    """A frame that is not a request. `fatal`: the stream cannot be read further (a length
    beyond MAX_MESSAGE: its body is never read, so the next frame's start is unknown)."""

    def __init__(self, msg: str, fatal: bool = False):
        super().__init__(msg)
        self.fatal = fatal


def recv_msg(sock: socket.socket) -> dict | None:
    """The next message (a JSON object), or None when the peer closed the connection.
    Raises BadMessage for anything else."""
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_MESSAGE:
        raise BadMessage(f"message of {n} bytes exceeds {MAX_MESSAGE}", fatal=True)
    body = _recv_exact(sock, n)
    if body is None:
        return None
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: deeply nested arrays
        raise BadMessage(f"message is not JSON ({type(e).__name__}: {e})") from None
    if not isinstance(msg, dict):
        raise BadMessage(f"message must be a JSON object, got {type(msg).__name__}")
    return msg


# op -> (required fields, optional fields), each field -> its JSON type
REQUESTS = {
    "attach": ({"job_file": str, "rank": int}, {"pid": int, "local_rank": int, "local_size": int}),
    "allreduce": ({"shm": str, "n": int, "dtype": str}, {"layer_index": int, "layer_count": int}),
    # n: the bytes of this process's shard, at the segment's start; the segment holds every
    # process's (the job's ranks x local_size), where the gathered shards land in order
    "allgather": ({"shm": str, "n": int}, {}),
    # n: the elements of the whole tensor; this process's shard of the sum comes back at the
    # segment's start (torch.chunk's split over every process, FSDP2's)
    "reduce_scatter": ({"shm": str, "n": int, "dtype": str}, {}),
    "status": ({}, {}),
}


def check_request(msg: dict) -> str | None:
    """Why `msg` is not a well-formed request (naming the field), or None."""
    op = msg.get("op")
    if not isinstance(op, str) or op not in REQUESTS:
        return f"field 'op': unknown op {op!r} (known: {', '.join(REQUESTS)})"
    required, optional = REQUESTS[op]
    for k, v in msg.items():
        if k == "op":
            continue
        kind = required.get(k, optional.get(k))
        if kind is None:
            return f"{op}: unknown field '{k}' (known: {', '.join(['op', *required, *optional])})"
        problem = kind_problem(v, kind)
        if problem:
            return f"{op}: field '{k}': {problem}"
    for k in required:
        if k not in msg:
            return f"{op}: field '{k}' is missing"
    return None


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
