"""The test suite, a package: its modules import each other as `tests.<module>` and its worker
scripts run as modules from the repository root (`python -m tests.run_worker ...`)."""
