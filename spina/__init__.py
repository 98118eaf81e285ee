"""SpINA's shared core (docs/architecture.md)."""


def version() -> str:
    """The installed spina package's version, or 'unknown' in a clone run without setup."""
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("spina")
    except PackageNotFoundError:
        return "unknown"
