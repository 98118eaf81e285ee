"""A package's names loaded from their modules on first use (PEP 562), so importing one part
of a package does not import the rest (host_agent.daemon, host_agent.compression,
host_agent.hooks)."""
from __future__ import annotations

import importlib


def lazy_names(package: str, owners: dict[str, str], module_globals: dict):
    """(__getattr__, __dir__) for `package`: owners[name] is the submodule defining name."""

    def __getattr__(name: str):
        owner = owners.get(name)
        if owner is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{owner}"), name)

    def __dir__():
        return sorted([*module_globals, *owners])

    return __getattr__, __dir__
