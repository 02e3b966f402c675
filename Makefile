# The two commands of the README, set-up included: `make train` and `make test` make the virtual
# environment .venv on first use (torch first, then rqrl with its extras) and reuse it after;
# pyproject.toml newer than the environment installs again. Manage your own environment instead
# with the pip lines of the README.
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
EXTRAS ?= test,video,box2d,mujoco,atari,minatar,dashboard
CONFIG ?= deploy/configs/cartpole_dqn.py
STAMP := $(VENV)/.rqrl-installed

.PHONY: train test setup

train: $(STAMP)
	$(VENV)/bin/rqrl train $(if $(ENV),--env $(ENV) $(if $(ALGO),--algo $(ALGO)),$(CONFIG)) $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest $(ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(if $(TORCH),$(VENV)/bin/python -m pip install "$(TORCH)")
	$(VENV)/bin/python -m pip install -e ".[$(EXTRAS)]"
	touch $@
