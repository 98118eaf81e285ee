"""Compression settings: `CompressionConfig` is spina.communication's (the job file's
"communication" section delegates to it, and spina imports nothing of host_agent)."""
from spina.communication import METHODS, VOTES, CompressionConfig

__all__ = ["CompressionConfig", "METHODS", "VOTES"]
