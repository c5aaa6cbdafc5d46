# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DIST   := dist
TARGETS ?= edgetpu,rpi,cpu,jetson

.PHONY: install demo test lint model data bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=77'  # 77: SPDX licence strings; tests build the wheel without isolation
	$(BIN)/python -m pip install -q -e '.[dev,serve,vector]'
	touch $(STAMP)

install: $(STAMP)

# Build the bundled demo model for every target (offline), then benchmark what runs here.
demo: $(STAMP)
	$(BIN)/edgekit build --model models/demo.keras --target $(TARGETS) \
		--calib calib/fashion --calib calib/frames --eval eval/fashion --out $(DIST)
	$(BIN)/python -m scripts.demo_bench --dist $(DIST)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

# Retrain the demo model (needs Debian's dataset-fashion-mnist; about 5 minutes on 2 cores).
model: $(STAMP)
	$(BIN)/python -m robot.train --data fashion-mnist --arch edge --input-size 32 --epochs 12 \
		--out models/demo.keras

# Regenerate the committed calibration/evaluation images (needs dataset-fashion-mnist).
data: $(STAMP)
	$(BIN)/python -m scripts.make_demo_data

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/preprocess.py
	$(BIN)/python benchmarks/precision.py
	$(BIN)/python benchmarks/footprint.py
	$(BIN)/python benchmarks/daemon_throughput.py
	$(BIN)/python benchmarks/daemon_soak.py --minutes 3

clean:
	rm -rf $(DIST) .pytest_cache .ruff_cache
