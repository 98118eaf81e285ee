"""Fixtures test files in more than one module take by name: hosts in network namespaces and
their management bridge (tests/netns.py); the fake
P4Runtime switches of the controller tests (tests/test_controller.py); a 2-worker job file
on an in-process software switch (the compressed hooks' tests)."""
import pytest

from host_agent.launch import local_job
from softswitch.udp import UdpSwitch
from spina.config import JobFile
from tests.netns import hosts, managed_hosts  # noqa: F401  (fixtures, found by name)
from tests.test_controller import fake, grpc_servers  # noqa: F401  (fixtures, found by name)


@pytest.fixture
def job_file(tmp_path):
    """A software switch (thread in this process) with a 2-worker job of 16-element blocks."""
    job = local_job(2, block_size=16, nlanes=8, nslots=4)
    with UdpSwitch(port=0) as sw:
        sw.add_job(job)
        JobFile(job, sw.address).write(tmp_path / "job.json")
        yield tmp_path / "job.json"
