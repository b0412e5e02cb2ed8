# Two commands on a fresh clone: `make train` and `make test`; both build .venv first.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-lock
GIN ?= configs/dqn_cartpole.gin
SWEEP ?= configs/sweeps/dqn_lr.yaml
ARGS ?=
COLLECTORS ?= auto
# make test runs one pytest worker per core (whole files per worker, so module fixtures are built once).
TEST_WORKERS ?= 2
DIST_GIN ?= configs/sac_pendulum_distributed.gin

.PHONY: install train train-distributed test test-slow bench sweep tensorboard lint lock clean \
	postgres postgres-stop slurm slurm-stop

install: $(STAMP)

# Rebuilt whenever requirements.lock changes; a half-built venv is removed. The project
# itself is installed editable (no deps: the lock has them), so its packages import each
# other from anywhere without sys.path edits.
$(STAMP): requirements.lock pyproject.toml
	@python=$$(scripts/find_python.sh) || exit 1; \
	echo "Creating $(VENV) with $$python"; \
	rm -rf $(VENV) && "$$python" -m venv $(VENV) && \
	$(PY) -m pip install --quiet --upgrade pip && \
	$(PY) -m pip install --quiet -r requirements.lock && \
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . || { rm -rf $(VENV); exit 1; }
	@touch $(STAMP)

train: install
	$(PY) train.py --gin_file=$(GIN) $(ARGS)

# Replay server, COLLECTORS collectors, learner and evaluator on this machine (logs under
# <root_dir>/logs/); Ctrl-C stops them all. See docs/distributed.md.
train-distributed: install
	$(PY) -m app.launch --gin_file=$(DIST_GIN) --collectors=$(COLLECTORS) $(ARGS)

# pytest exits 5 when a selection collects no tests; that is not a failure here.
test: install
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

test-slow: install
	$(PY) -m pytest -m slow $(ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

bench: install
	$(PY) -m bench.run_all $(ARGS)

# A small default sweep: 2 learning rates x 2 seeds on CartPole (a few minutes on 2 cores).
sweep: install
	$(PY) sweep.py --gin_file=$(GIN) --sweep=$(SWEEP) $(ARGS)

# A throwaway PostgreSQL server on 127.0.0.1:$(PG_PORT) (data in $(PG_DIR)) for sweeps across
# machines: sweep.py --storage <the URL it prints>. `make postgres-stop` stops it.
PG_DIR ?= /tmp/rl-training-postgres
PG_PORT ?= 55432
postgres:
	@scripts/postgres.sh start $(PG_DIR) $(PG_PORT)

postgres-stop:
	@scripts/postgres.sh stop $(PG_DIR)

# A throwaway one-node Slurm cluster (munged, slurmctld, slurmd; state in $(SLURM_DIR)) for
# `python -m app.slurm ...` (docs/cluster.md): export the SLURM_CONF line it prints. Installs
# Debian's slurm-wlm and munge first if they are missing (needs root). `make slurm-stop` ends it.
SLURM_DIR ?= /tmp/rl-training-slurm
SLURM_CPUS ?= 16
slurm:
	@command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || scripts/slurm.sh install
	@scripts/slurm.sh start $(SLURM_DIR) $(SLURM_CPUS)

slurm-stop:
	@scripts/slurm.sh stop $(SLURM_DIR)

tensorboard: install
	$(VENV)/bin/tensorboard --logdir runs

lint: install
	$(VENV)/bin/ruff check .

# Re-resolve requirements.in into requirements.lock in a scratch venv.
lock:
	@python=$$(scripts/find_python.sh) || exit 1; \
	rm -rf /tmp/lock-venv && "$$python" -m venv /tmp/lock-venv && \
	/tmp/lock-venv/bin/pip install --quiet -r requirements.in && \
	/tmp/lock-venv/bin/pip freeze --exclude pip > requirements.lock

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
