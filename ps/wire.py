"""The bytes of one parameter-server message, carried as a gRPC request or response body.

    uint32 little-endian  n: length of the JSON header
    n bytes               header (UTF-8 JSON); header["arrays"] = [[dtype, length], ...]
    ...                   each array's raw little-endian bytes, in that order

gRPC frames, delivers and times out the messages; this only lays out one body, so the
servers need no generated code (grpc's generic handlers take and return bytes).
"""
from __future__ import annotations

import json
import struct

import numpy as np

_LEN = struct.Struct("<I")


def pack(head: dict, *arrays: np.ndarray) -> bytes:
    """One message: `head` (JSON-able) followed by `arrays` (1-D, little-endian)."""
    arrays = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    h = dict(head, arrays=[[a.dtype.str, len(a)] for a in arrays])
    hb = json.dumps(h, separators=(",", ":")).encode()
    return b"".join([_LEN.pack(len(hb)), hb] + [a.tobytes() for a in arrays])


def unpack(body: bytes) -> tuple[dict, list[np.ndarray]]:
    """The inverse of `pack`: (header, arrays); the arrays are read-only views of `body`."""
    (n,) = _LEN.unpack_from(body)
    head = json.loads(body[4:4 + n])
    off, arrays = 4 + n, []
    for dtype, length in head.pop("arrays"):
        a = np.frombuffer(body, dtype=np.dtype(dtype), count=length, offset=off)
        arrays.append(a)
        off += a.nbytes
    if off != len(body):
        raise ValueError(f"message has {len(body) - off} trailing bytes")
    return head, arrays
