"""The tier of every test: the one place that says which tests `make check` runs.

Tiers, cheapest first (pyproject.toml declares them as markers):
  unit       one process: the code under test in this one (threads, loopback sockets, cpp)
  processes  starts SpINA processes (a switch, agents, daemons, ranks, a command) on loopback
  netns      needs root: network namespaces, veths, iptables, mininet (skips, saying why, elsewhere)
  p4         needs p4c, BMv2, bf-p4c or the Tofino SDE (skips, saying why, where they are missing)
  soak       the long soak (1000 calls in `make test`, SPINA_SOAK_CALLS to change)
`make check` runs unit; `make test` runs every tier; `pytest -m TIER` one.

A test's tier is its module's (MODULES), raised by what it uses (FIXTURES, PARAMS) or by name
(TESTS); a test module listed nowhere stops the collection, so no new file escapes a tier.
"""
from __future__ import annotations

import fnmatch

import pytest

TIERS = ("unit", "processes", "netns", "p4", "soak")

MODULES = {
    "unit": """
        bmv2_tests/test_admission.py bmv2_tests/test_aggregation.py bmv2_tests/test_bmv2_client.py
        bmv2_tests/test_egress_rewrite.py bmv2_tests/test_fabric.py bmv2_tests/test_forwarding.py
        bmv2_tests/test_gather.py bmv2_tests/test_lanes.py bmv2_tests/test_priority.py
        bmv2_tests/test_scatter.py
        tests/test_agent_datapath.py tests/test_agent_refused.py tests/test_allgather.py
        tests/test_allreduce.py tests/test_bad_input.py tests/test_bench.py tests/test_bits.py
        tests/test_capture.py tests/test_collectives.py tests/test_comm_hooks.py
        tests/test_compression.py tests/test_controller.py tests/test_controller_bfrt.py
        tests/test_controller_tofino.py tests/test_core.py tests/test_datapath.py
        tests/test_datapath_l2.py tests/test_dlcp.py tests/test_dlcp_switch.py
        tests/test_doc_blocks.py tests/test_doc_links.py tests/test_egress.py
        tests/test_fabric_controller.py tests/test_fabric_end_to_end.py tests/test_fabric_plan.py
        tests/test_fabric_roles.py tests/test_floor.py tests/test_ina_model.py
        tests/test_job_schema.py tests/test_l2_dataplane.py tests/test_lanes.py
        tests/test_largebatch_lamb.py
        tests/test_logs.py tests/test_metrics.py tests/test_module_map.py tests/test_narrow_lanes.py
        tests/test_net.py tests/test_overlap.py tests/test_p4_agreement.py
        tests/test_p4_model.py tests/test_p4info.py tests/test_p4runtime_server.py
        tests/test_p4runtime_shell.py tests/test_plan.py tests/test_ps.py tests/test_recovery.py
        tests/test_reduce_scatter.py
        tests/test_reliability.py tests/test_run_identity.py tests/test_softswitch.py
        tests/test_testbed_topos.py
        tests/test_tna_agreement.py tests/test_tna_model.py tests/test_tna_testgen.py
        tests/test_torch_hook.py
        tests/test_wire.py
    """,
    "processes": """
        tests/test_agent_echo.py tests/test_cli.py
        tests/test_controller_softswitch.py tests/test_daemon.py tests/test_daemon_hier.py
        tests/test_demo.py tests/test_fabric_processes.py tests/test_fsdp.py
        tests/test_fsdp_example.py
        tests/test_readme_path.py tests/test_seams.py tests/test_torch_backend.py
    """,
    "netns": """
        tests/test_dlcp_bench.py
        tests/test_hier_bench.py tests/test_hier_gather_bench.py tests/test_l2_netns.py
        tests/test_l2_rate.py tests/test_mininet.py tests/test_netns_loss.py
        tests/test_netns_primitives.py tests/test_torchrun_multihost.py
    """,
    "p4": "tests/test_controller_bmv2.py",
    "soak": "tests/test_soak.py",
}

# Tests above their module's tier, by name (fnmatch patterns, parameters left out).
TESTS = {
    "processes": """
        tests/test_bad_input.py::test_controller_* tests/test_bad_input.py::test_host_agent_cli
        tests/test_bad_input.py::test_softswitch_cli tests/test_bad_input.py::test_testbed_cli
        tests/test_bad_input.py::test_each_* tests/test_bad_input.py::test_one_rank_*
        tests/test_bad_input.py::test_ps_* tests/test_bad_input.py::test_spina_refuses_*
        tests/test_bad_input.py::test_switch_with_a_busy_*
        tests/test_bench.py::test_all_reduce_loopback
        tests/test_bench.py::test_all_reduce_on_two_switch_threads
        tests/test_bench.py::test_bad_input_is_one_line
        tests/test_bench.py::test_spina_bench_is_the_harness tests/test_bench.py::test_switch_alone
        tests/test_bench.py::test_first_touch tests/test_bench.py::test_scale_out_*
        tests/test_bench.py::test_profile
        tests/test_bits.py::test_ddp_* tests/test_bits.py::test_example_*
        tests/test_capture.py::test_capture_into_a_closed_pipe_*
        tests/test_capture.py::test_rdpcap_* tests/test_capture.py::test_tshark_*
        tests/test_collectives.py::test_all_gathers_through_the_switch
        tests/test_collectives.py::test_ddp_* tests/test_collectives.py::test_eight_*
        tests/test_collectives.py::test_four_ranks_exact tests/test_comm_hooks.py::test_ddp_*
        tests/test_compression.py::test_ddp_* tests/test_compression.py::test_example_*
        tests/test_controller.py::test_cli_help tests/test_controller.py::test_sigterm_*
        tests/test_controller_bfrt.py::test_cli_* tests/test_controller_tofino.py::test_cli_*
        tests/test_dlcp.py::test_daemon_options_* tests/test_dlcp.py::test_example_*
        tests/test_dlcp_switch.py::test_controller_refuses_a_bound_out_of_range
        tests/test_doc_links.py::test_every_relative_link_resolves
        tests/test_egress.py::test_port_rate_option_bad_values_are_one_line
        tests/test_floor.py::test_relay_process_* tests/test_ina_model.py::test_spina_plan_*
        tests/test_l2_dataplane.py::test_cli_help
        tests/test_largebatch_lamb.py::test_bad_run_flag_exits_2
        tests/test_largebatch_lamb.py::test_dense_warmup_then_frozen_run
        tests/test_logs.py::test_a_bad_log_option_* tests/test_logs.py::test_daemon_config_*
        tests/test_logs.py::test_launcher_* tests/test_logs.py::test_switch_and_controller_*
        tests/test_metrics.py::test_agent_launch_serves_*
        tests/test_metrics.py::test_alert_* tests/test_metrics.py::test_controller_metrics_only_*
        tests/test_metrics.py::test_dashboard_queries_*
        tests/test_metrics.py::test_real_prometheus_* tests/test_metrics.py::test_switch_cli_*
        tests/test_overlap.py::test_ddp_* tests/test_plan.py::test_spina_plan_*
        tests/test_ps.py::test_block_topk_selects_* tests/test_ps.py::test_crashed_shard_*
        tests/test_ps.py::test_example_smoke tests/test_run_identity.py::test_a_replaced_*
        tests/test_run_identity.py::test_controller_serve_*
        tests/test_run_identity.py::test_daemon_* tests/test_run_identity.py::test_ddp_*
        tests/test_run_identity.py::test_second_* tests/test_softswitch.py::test_softswitch_cli_*
        tests/test_torch_hook.py::test_agent_from_env_takes_* tests/test_torch_hook.py::test_ddp_*
        tests/test_torch_hook.py::test_launcher_*
    """,
    "netns": """
        tests/test_bench.py::test_all_gather_on_a_star
        tests/test_bench.py::test_all_reduce_on_a_topology_file
        tests/test_bench.py::test_loss_on_a_star tests/test_bench.py::test_plan_on_a_pair
        tests/test_bench.py::test_fsdp_on_a_star tests/test_bench.py::test_training_on_a_star
        tests/test_bench.py::test_targets_smoke
        tests/test_datapath_l2.py::test_the_switch_sends_every_port_the_same_frames_on_both_paths
        tests/test_doc_blocks.py::test_make_demo_as_written
        tests/test_doc_blocks.py::test_page_runs_* tests/test_doc_blocks.py::test_runner_catches_*
        tests/test_overlap.py::test_overlap_bench_*
        tests/test_seams.py::test_mininet_* tests/test_seams.py::test_switches_on_namespaced_hosts_*
    """,
    "p4": """
        tests/test_controller_bfrt.py::test_a_*
        tests/test_controller_bfrt.py::test_deploy_*
        tests/test_controller_bfrt.py::test_job_removal_*
        tests/test_controller_bfrt.py::test_reset_* tests/test_controller_bfrt.py::test_status_*
        tests/test_controller_bfrt.py::test_the_same_*
        tests/test_controller_tofino.py::test_real_bf_p4c_output
        tests/test_mininet.py::test_two_level_on_bmv2_nodes_*
        tests/test_p4info.py::test_p4info_is_current
        tests/test_tna_agreement.py::test_role_pieces_on_one_stateful_alu
        tests/test_tna_agreement.py::test_the_hold_on_one_stateful_alu
        tests/test_tna_agreement.py::test_tna_p4info_is_current
    """,
}

FIXTURES = {"hosts": "netns", "managed_hosts": "netns"}  # tests/netns.py
PARAMS = {("target", "bmv2"): "p4", ("switch", "bmv2"): "p4"}  # a parametrized run on BMv2

_MODULE_TIER = {m: tier for tier, text in MODULES.items() for m in text.split()}
_TEST_TIERS = [(p, tier) for tier, text in TESTS.items() for p in text.split()]


def tier_of(item: pytest.Item) -> str:
    """The costliest tier that applies to `item`; a module without one is a usage error."""
    path = item.nodeid.split("::", 1)[0]
    if path not in _MODULE_TIER:
        raise pytest.UsageError(f"{path}: no tier; add the module to MODULES in conftest.py")
    found = [_MODULE_TIER[path]]
    name = f"{path}::{getattr(item, 'originalname', item.name)}"
    found += [tier for pattern, tier in _TEST_TIERS if fnmatch.fnmatchcase(name, pattern)]
    found += [tier for f, tier in FIXTURES.items() if f in item.fixturenames]
    params = getattr(getattr(item, "callspec", None), "params", {})
    found += [tier for (k, v), tier in PARAMS.items() if params.get(k) == v]
    return max(found, key=TIERS.index)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(tier_of(item))
    if any("::" in a for a in config.args):
        return  # single tests named: a pattern may match none of them
    names = {f"{i.nodeid.split('::', 1)[0]}::{getattr(i, 'originalname', i.name)}"
             for i in items}
    paths = {n.split("::", 1)[0] for n in names}
    stale = [p for p, _ in _TEST_TIERS
             if p.split("::", 1)[0] in paths and not fnmatch.filter(names, p)]
    if stale:
        raise pytest.UsageError(f"conftest.py TESTS: {', '.join(stale)} match no test")
