"""Fixtures any test file here takes by name: hosts in network namespaces, their management
bridge and veth pairs between switch processes (tests/netns.py)."""
from netns import hosts, managed_hosts, veth_pairs  # noqa: F401  (fixtures, found by name)
