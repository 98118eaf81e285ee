"""Gradient compression that rides SpINA's sparse aggregation (README.md in this folder)."""
from host_agent.compression.compressors import (
    BlockTopK,
    BucketLayout,
    Compressor,
    DenseCompressor,
    LossComp,
    RandomK,
    ResidualMemory,
    ScaledMask,
    Selection,
)
from host_agent.compression.config import METHODS, CompressionConfig
from host_agent.compression.methods import make_compressor
from host_agent.compression.votes import SignVote, TernGrad, VoteHookState, spina_vote_hook

__all__ = ["CompressionConfig", "METHODS", "Compressor", "BlockTopK", "RandomK", "ScaledMask",
           "LossComp", "DenseCompressor", "BucketLayout", "Selection", "ResidualMemory",
           "make_compressor", "SignVote", "TernGrad", "VoteHookState", "spina_vote_hook"]
