# SpINA. `make demo` and `make test` set everything up on a fresh Debian machine themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup core demo lint check test soak bench bench-quick bench-l2 bench-net bench-dlcp bench-collectives bench-allgather bench-hier-gather bench-train bench-overlap bench-targets profile clean help p4 p4-check tofino testbed deploy serve dissector

help:  ## list targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# Every C source and header of the packages (setup.py builds them): a new one needs no edit here.
C_FILES := $(wildcard */*.c */*.h */*/*.c */*/*.h)

$(STAMP): pyproject.toml setup.py $(C_FILES) scripts/setup.sh
	bash scripts/setup.sh $(VENV) $(PYTHON)
	touch $(STAMP)

setup: $(STAMP)  ## create .venv, install Debian and Python dependencies, build the C parts

# The compiled parts (host_agent/_core*.c, host_agent/compression/_kernels.c,
# softswitch/_datapath.c, bench/_floor.c), rebuilt in this tree (a worktree sharing another
# tree's venv: `make core PY=/path/to/python`).
core:  ## rebuild the C parts (agent core, compression kernels, switch data path, floor) in place, each by rename
	$(PY) setup.py -q build_ext --inplace

demo: $(STAMP)  ## the main job: software switch + 4 workers, sparse all-reduce vs gloo
	$(PY) -m spina_cli.demo $(DEMO_ARGS)

lint: $(STAMP)  ## ruff check, as configured in pyproject.toml [tool.ruff]
	$(PY) -m ruff check .

# Tiers (conftest.py gives every test one): unit, processes, netns (root), p4 (p4c/BMv2/bf-p4c), soak.
PYTEST_ARGS ?= --durations=25  # the slowest tests named in every run: the suite has a 25 min budget
# check: the unit tier, 4.9-5.5 min of pytest under load 5-7 here (the processes tier: 11-14 min)
CHECK_TIERS ?= unit
check: $(STAMP) lint  ## ruff, then the unit tier (one process; CHECK_TIERS="unit or processes" adds more): the edit-test loop
	$(PY) -m pytest -m "$(CHECK_TIERS)" $(PYTEST_ARGS)

test: $(STAMP) lint  ## ruff, then every tier: unit, processes, netns (root), p4, the soak (CI runs this)
	$(PY) -m pytest $(PYTEST_ARGS)

soak: $(STAMP)  ## longer soak: 5000 all-reduces of 1M elements at 5% loss (SOAK_CALLS=N)
	SPINA_SOAK_CALLS=$${SOAK_CALLS:-5000} $(PY) -m pytest -s tests/test_soak.py

# P4 build outputs of our own source (p4src/); p4c itself is never built here (p4src/README.md).
P4C       ?= p4c-bm2-ss
P4_TOP    := p4src/v1model/spina_v1model.p4
P4_OUT    := p4src/build
P4_SRCS   := $(shell find p4src -name '*.p4')

p4:  ## compile p4src/ for BMv2 (BMv2 JSON + P4Info) when p4c-bm2-ss is on PATH
	@if ! command -v $(P4C) >/dev/null 2>&1; then \
	  echo "make p4: '$(P4C)' is not on PATH, so the P4 program was NOT compiled."; \
	  echo "         Install p4c from its upstream sources (see p4src/README.md), then rerun."; \
	  exit 0; \
	fi; \
	mkdir -p $(P4_OUT) && \
	$(P4C) --arch v1model -o $(P4_OUT)/spina_v1model.json \
	  --p4runtime-files $(P4_OUT)/spina_v1model.p4info.txtpb $(P4_TOP) && \
	echo "make p4: wrote $(P4_OUT)/spina_v1model.json and $(P4_OUT)/spina_v1model.p4info.txtpb"

p4-check:  ## preprocess the P4 with cpp and run the P4/Python agreement tests (no p4c needed)
	$(PY) -m pytest -q tests/test_p4_agreement.py tests/test_tna_agreement.py

# The Tofino 1 program (tofino/); the open-source Tofino compiler is never built here
# (tofino/README.md). Its full output (binary, context) stays in TNA_WORK; tofino/build/ keeps
# the P4Info, the BF-RT JSON and a resource summary. A second compile with standard P4Runtime
# externs gives the P4Info a P4Runtime server takes (registers and counters as P4Runtime
# entities) and, in TNA_WORK/p4runtime, the controller's device_config directory.
BF_P4C    ?= bf-p4c
TNA_TOP   := tofino/spina_tna.p4
TNA_OUT   := tofino/build
TNA_WORK  ?= /tmp/spina-tna-build
# The lane-width profile (tofino/size.p4 SPINA_LANE_BITS): 32 (default), 16 or 8. A narrow
# profile's files are named after it (spina_tna16.*, resources16.md).
TNA_LANE_BITS ?= 32
TNA_SUFFIX := $(filter-out 32,$(TNA_LANE_BITS))
TNA_NAME  := spina_tna$(TNA_SUFFIX)
TNA_FLAGS := --target tofino --arch tna -DSPINA_LANE_BITS=$(TNA_LANE_BITS)

tofino:  ## compile tofino/ for Tofino 1 (P4Info, BF-RT JSON, resources) when bf-p4c is on PATH; TNA_LANE_BITS=16|8: a narrow-lane profile
	@if ! command -v $(BF_P4C) >/dev/null 2>&1; then \
	  echo "make tofino: '$(BF_P4C)' is not on PATH, so the TNA program was NOT compiled."; \
	  echo "             Build p4c's open-source Tofino backend by hand (see tofino/README.md), then rerun."; \
	  exit 0; \
	fi; \
	rm -rf $(TNA_WORK) && mkdir -p $(TNA_WORK) $(TNA_OUT) && \
	$(BF_P4C) $(TNA_FLAGS) -g --verbose 1 -o $(TNA_WORK) \
	  --p4runtime-files $(TNA_OUT)/$(TNA_NAME).p4info.txtpb $(TNA_TOP) && \
	cp $(TNA_WORK)/bfrt.json $(TNA_OUT)/$(TNA_NAME).bfrt.json && \
	$(PYTHON) scripts/tna_resources.py $(TNA_WORK) "$$($(BF_P4C) --version)" $(TNA_LANE_BITS) \
	  > $(TNA_OUT)/resources$(TNA_SUFFIX).md && \
	$(BF_P4C) $(TNA_FLAGS) -o $(TNA_WORK)/p4runtime --p4runtime-force-std-externs \
	  --p4runtime-files $(TNA_OUT)/$(TNA_NAME).std.p4info.txtpb $(TNA_TOP) && \
	echo "make tofino: wrote $(TNA_OUT)/$(TNA_NAME).p4info.txtpb, $(TNA_NAME).std.p4info.txtpb," \
	  "$(TNA_NAME).bfrt.json and resources$(TNA_SUFFIX).md; device config files in $(TNA_WORK)/p4runtime"

TOPO ?= single
testbed: $(STAMP)  ## mininet testbed (root): TOPO=single|leafspine ARGS="--hosts 4 --cli"
	$(PY) -m testbed $(TOPO) $(ARGS)

# The controller makes a running switch hold controller/examples/$(TARGET).yaml (or DEPLOY=FILE).
TARGET ?= softswitch
DEPLOY ?= controller/examples/$(TARGET).yaml
deploy: $(STAMP)  ## push pipeline and jobs: TARGET=softswitch|bmv2|tofino|tofino_bfrt (switch running; controller/README.md)
	$(PY) -m controller -c $(DEPLOY) deploy

serve: $(STAMP)  ## deploy, then give every run of a job its own epoch until Ctrl-C: TARGET=softswitch|bmv2|tofino|tofino_bfrt
	$(PY) -m controller -c $(DEPLOY) serve

# Every bench is `python -m bench WHAT` (bench/README.md: the options and columns are the same
# for every WHAT); results in bench/results/<name>/ (CSV, plot, summary.md, command.txt).
bench: $(STAMP)  ## SpINA vs the floor and gloo all-reduce on loopback, 4 ranks, 1-64 MiB, 4 densities: bench/results/all_reduce_loopback/sizes/
	$(PY) -m bench all_reduce -b 1M -e 64M -f 4 -d 1,0.1,0.01,0.001 -g 4 -m spina,spina_blocks,floor,gloo_allreduce,gloo_allgather --name all_reduce_loopback/sizes $(BENCH_ARGS)

bench-quick: $(STAMP)  ## 4 ranks x 25M elements (100 MB) at 4 densities, SpINA vs the floor and gloo all_reduce: bench/results/all_reduce_loopback/quick/
	$(PY) -m bench all_reduce -b 100000000 -e 100000000 -d 1,0.1,0.01,0.001 -g 4 --name all_reduce_loopback/quick $(BENCH_ARGS)

bench-l2: $(STAMP)  ## (root) L2-mode switch: lossless INA frame rate of 4 namespaced workers: bench/results/l2/rates/
	$(PY) -m bench l2 --name l2/rates $(BENCH_ARGS)

bench-net: $(STAMP)  ## (root) all-reduce over rate-limited links (star4.yaml at 1 and 10 Gbit/s): bench/results/all_reduce_net/star4/
	$(PY) -m bench all_reduce -t bench/topologies/star4.yaml --rates 1gbit,10gbit -b 1M -e 64M -f 8 -d 1,0.01 --name all_reduce_net/star4 $(NET_BENCH_ARGS)

bench-dlcp: $(STAMP)  ## (root; 3 min here) DLCP step time under a congested queue: exact vs 1%/10% bounds, priorities, gloo: bench/results/dlcp_congestion/default/
	$(PY) -m bench dlcp --name dlcp_congestion/default $(DLCP_BENCH_ARGS)

bench-collectives: $(STAMP)  ## (root; ~10 min here) the planner checked: every all-reduce algorithm measured vs predicted on four topology files: bench/results/collectives_planner/<file>/
	for t in package4 two_groups torus2x2 star4; do $(PY) -m bench plan -t bench/topologies/$$t.yaml --name collectives_planner/$$t $(COLLECTIVES_BENCH_ARGS) || exit 1; done

bench-allgather: $(STAMP)  ## (root) all-gather through the switch vs gloo's all_gather on star4.yaml at 1 and 10 Gbit/s: bench/results/all_gather_net/star4/
	$(PY) -m bench all_gather -t bench/topologies/star4.yaml --rates 1gbit,10gbit -b 256K -e 128M -f 8 --name all_gather_net/star4 $(ALLGATHER_BENCH_ARGS)

bench-hier-gather: $(STAMP)  ## (root; 1 min here) hierarchical all-gather vs the flat switch all-gather, 2-D, ring and gloo on two groups under a switch: bench/results/hier_gather/two_groups_switch/
	$(PY) -m bench hier_gather --name hier_gather/two_groups_switch $(HIER_GATHER_BENCH_ARGS)

bench-train: $(STAMP)  ## (root; 4-7 min here) DDP training over star4.yaml at 1 and 10 Gbit/s: gloo vs SpINA dense (32-, 16- and 8-bit lanes) vs top-k vs PowerSGD/fp16/bf16 hooks, step time and time to accuracy: bench/results/training_net/star4/
	$(PY) -m bench training -t bench/topologies/star4.yaml --rates 1gbit,10gbit --name training_net/star4 $(TRAIN_BENCH_ARGS)

bench-targets: $(STAMP)  ## (root; 12-15 min here) issue 47's targets from one run: the harness commands that measure them, then each target met or not: bench/results/targets/issue47/targets.md
	$(PY) -m bench.targets $(TARGETS_ARGS)

bench-overlap: $(STAMP)  ## (root; 3 min here) priority overlap vs DDP's default order over star4.yaml at 1 Gbit/s, with a timeline: bench/results/overlap/star4/
	$(PY) -m bench overlap --name overlap/star4 $(OVERLAP_BENCH_ARGS)

profile: $(STAMP)  ## cProfile + memory of agent and software switch at the base point (4 ranks, 25M elements): bench/results/profile/base/
	$(PY) -m bench profile --name profile/base $(PROFILE_ARGS)

dissector:  ## regenerate docs/spina.lua (Wireshark dissector) from spina/wire.py HEADER_FIELDS
	$(PY) -m spina.dissector > docs/spina.lua

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache build *.egg-info host_agent/_core.*.so \
	  host_agent/compression/_kernels.*.so bench/_floor.*.so
