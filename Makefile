# The two commands of the README, set-up included: `make train` and `make test` make the virtual
# environment .venv on first use (torch first, then rqrl) and reuse it after; pyproject.toml newer
# than the environment installs again. `make train` installs rqrl with just the extra its preset
# or config needs (none for CartPole; LunarLander box2d, Atari atari, ...), `make test` with the
# test set (every extra the suite exercises). Manage your own environment instead with the pip
# lines of the README.
#
#   make train                          DQN on CartPole (deploy/configs/cartpole_dqn.py)
#   make train ENV=Acrobot-v1 [ALGO=dqn] a tuned preset (rqrl presets lists them)
#   make train CONFIG=deploy/configs/cartpole_ppo.py ARGS="--seed 3"
#   make test [ARGS="tests/unit -x"]

PYTHON ?= python3
VENV ?= .venv
# Installed before rqrl, so pyproject's torch range is met by it (here: the CPU wheel the machine
# provides); set TORCH= to keep the torch your environment has, e.g. a CUDA build.
TORCH ?= torch==2.13.0
EXTRAS ?= test,video,box2d,mujoco,atari,minatar,league,dashboard
CONFIG ?= deploy/configs/cartpole_dqn.py
TARGET := $(if $(ENV),$(ENV),$(CONFIG))
# Asked of the presets table with the standard library alone: no environment is needed yet.
TRAIN_EXTRA := $(shell $(PYTHON) -m common.presets --extra "$(TARGET)" 2>/dev/null)
VENV_STAMP := $(VENV)/.rqrl-venv
TEST_STAMP := $(VENV)/.rqrl-installed
TRAIN_STAMP := $(VENV)/.rqrl-train$(if $(TRAIN_EXTRA),-$(TRAIN_EXTRA))

.PHONY: train test setup

train: $(TRAIN_STAMP)
	$(VENV)/bin/rqrl train $(if $(ENV),--env $(ENV) $(if $(ALGO),--algo $(ALGO)),$(CONFIG)) $(ARGS)

test: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest $(ARGS)

setup: $(TEST_STAMP)

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(if $(TORCH),$(VENV)/bin/python -m pip install "$(TORCH)")
	touch $@

$(TEST_STAMP): $(VENV_STAMP)
	$(VENV)/bin/python -m pip install -e ".[$(EXTRAS)]"
	touch $@

# The test set holds every extra: an environment made by `make test` trains any preset as it is.
$(TRAIN_STAMP): $(VENV_STAMP)
	[ $(TEST_STAMP) -nt $(VENV_STAMP) ] || $(VENV)/bin/python -m pip install -e ".$(if $(TRAIN_EXTRA),[$(TRAIN_EXTRA)])"
	touch $@
