"""Mininet testbeds: topologies whose switch nodes run the SpINA pipeline (testbed/README.md)."""
