"""Gradient compression that rides SpINA's sparse aggregation (README.md in this folder).

The names below load their module when first asked for, so that a user of the kernels alone
(`host_agent.compression.kernels`: ps/topk.py) imports no torch. The DDP hooks that use
the compressors are host_agent.hooks' (compressed.py, votes.py).
"""
from __future__ import annotations

from spina.lazy import lazy_names

_OWNERS = {
    **dict.fromkeys(("BlockTopK", "BucketLayout", "Compressor", "DenseCompressor", "LossComp",
                     "RandomK", "ResidualMemory", "ScaledMask", "Selection"), "compressors"),
    "METHODS": "config", "CompressionConfig": "config",
    "make_compressor": "methods",
    **dict.fromkeys(("SignVote", "TernGrad"), "votes"),
}


__getattr__, __dir__ = lazy_names(__name__, _OWNERS, globals())

__all__ = ["CompressionConfig", "METHODS", "Compressor", "BlockTopK", "RandomK", "ScaledMask",
           "LossComp", "DenseCompressor", "BucketLayout", "Selection", "ResidualMemory",
           "make_compressor", "SignVote", "TernGrad"]
