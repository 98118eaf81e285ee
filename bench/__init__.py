"""Benchmarks of SpINA against torch.distributed gloo (README.md)."""
