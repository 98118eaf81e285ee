"""Every compression method by name: `make_compressor` builds the one a config names (the
compressors of compressors.py, the votes of votes.py, which build on the former; their hooks
are host_agent.hooks')."""
from __future__ import annotations

from host_agent.compression.compressors import (
    BlockTopK,
    Compressor,
    DenseCompressor,
    LossComp,
    RandomK,
    ScaledMask,
)
from host_agent.compression.config import CompressionConfig
from host_agent.compression.votes import SignVote, TernGrad

_BY_METHOD = {"none": DenseCompressor, "topk": BlockTopK, "randomk": RandomK, "scaled": ScaledMask,
              "losscomp": LossComp, "sign": SignVote, "ternary": TernGrad}


def make_compressor(config: CompressionConfig | dict | None = None, block_size: int = 256,
                    **fields) -> Compressor:
    """A compressor for `config` (a CompressionConfig, a mapping, or keyword fields).

    Example:
        >>> c = make_compressor(method="topk", ratio=0.01, momentum=0.9, warmup_steps=100)
    """
    if config is None:
        config = CompressionConfig(**fields)
    elif isinstance(config, dict):
        config = CompressionConfig.from_dict({**config, **fields})
    config = config.validate()
    return _BY_METHOD[config.method](config, block_size)
