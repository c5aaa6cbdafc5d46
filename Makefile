# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DIST   := dist
TARGETS ?= edgetpu,rpi,cpu,jetson

.PHONY: install demo test test-fast lint model models data detector bench clean mutate pi-check docs-check

# onnx2tf (ONNX -> TensorFlow for the TFLite targets) hard-pins an older TensorFlow/numpy stack:
# it goes in beside ours without its pins, with the few packages it really imports (edgekit/builders/convert/onnx_to_tf.py says why).
O2T    := $(VENV)/.onnx2tf-stamp

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=77'  # 77: SPDX licence strings; tests build the wheel without isolation
	$(BIN)/python -m pip install -q -e '.[dev,serve,vector]'
	touch $(STAMP)

$(O2T): $(STAMP) Makefile
	$(BIN)/python -m pip install -q --no-deps onnx2tf==1.29.24 onnx-graphsurgeon==0.6.1 sng4onnx==2.0.1 \
		'psutil>=5' 'tf-keras~=2.21.0' onnxsim==0.4.36
	touch $(O2T)

install: $(STAMP) $(O2T)

# Build the bundled demo models for every target (offline): the classifier (top-1 gate) and the
# detector (mAP gate); then print each bundle's accuracy and benchmark what runs here.
demo: $(STAMP)
	$(BIN)/edgekit build --model models/demo.keras --target $(TARGETS) \
		--calib calib/fashion --calib calib/frames --eval eval/fashion --out $(DIST)
	$(BIN)/edgekit build --model models/detector.keras --task detect --target $(TARGETS) \
		--calib calib/detect --eval eval/detect --out $(DIST)
	$(BIN)/python -m scripts.demo_bench --dist $(DIST)

# Two pytest-xdist workers, each test file whole on one of them (--dist loadfile: a file's module
# fixtures, brokers and daemons stay together; session fixtures are built once per worker, about 10 s).
# The suite waits much of its time (daemons, brokers, subprocesses), so on a loaded 2-core machine two
# workers took 11m48s where one took 23m26s (back to back, same load). Tests pick free ports and their
# own temp dirs; PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

test: $(STAMP) $(O2T)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(XDIST)

# The same without the tests marked slow (wall-clock figures, long soaks, full builds of every target).
test-fast: $(STAMP) $(O2T)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

# The device side on a Raspberry Pi's architecture (aarch64 bookworm, Python 3.11) under qemu-user, compared
# with x86-64 on the bundles `make demo` built (docs/pi.md). Cached under ~/.cache/edgekit/pi-check.
pi-check: $(STAMP)
	$(BIN)/python -m scripts.pi_check --dist $(DIST)

# Every command in README.md and docs/*.md, run as written from the repository root after `make demo`
# (those that need hardware, root or the network are listed with the reason; scripts/docs_check.py).
docs-check: $(STAMP)
	$(BIN)/python -m scripts.docs_check

# Mutation testing of the core modules, each against its own fast tests (docs/mutation.md; ~15 min on 2 cores).
mutate: $(STAMP)
	$(BIN)/python -m scripts.mutate

# Retrain the demo model (needs Debian's dataset-fashion-mnist; the background class's training photos
# come from Debian's gnome-backgrounds, scikit-learn and Matplotlib; 9.5 minutes on a busy 2-core VM).
model: $(STAMP)
	$(BIN)/python -m robot.train --data fashion-mnist --background 12000 --arch edge --input-size 32 \
		--epochs 8 --out models/demo.keras

# The second bundled models, made from models/demo.keras (not committed: it is retrained):
# models/demo.onnx (tf2onnx, NCHW like a PyTorch export), models/two_head.keras (class + regression) and
# models/demo.tflite (float16 weights, as MediaPipe publishes models).
models: $(STAMP) $(O2T)
	$(BIN)/python -m scripts.bundled_models

# Regenerate the committed calibration/evaluation images (needs dataset-fashion-mnist; scikit-image).
data: $(STAMP)
	$(BIN)/python -m scripts.make_demo_data

# Regenerate the demo detector's data (eval/detect, calib/detect: shapes on photos that install with
# scikit-image, scikit-learn, Matplotlib) and retrain it (models/detector.{keras,onnx}); offline.
# 18 minutes on a busy 2-core VM (8,000 scenes in 45 s, 15 epochs in 17 min).
detector: $(STAMP)
	$(BIN)/python -m scripts.detector_data
	$(BIN)/python -m scripts.train_detector

# every benchmark runs; then the exit is 1 if one missed a goal it printed (benchmarks/goals.py) or failed
bench: $(STAMP)
	@rc=0; for b in overhead.py preprocess.py precision.py footprint.py daemon_throughput.py \
	    "daemon_soak.py --minutes 3"; do \
	  echo "$(BIN)/python benchmarks/$$b"; $(BIN)/python benchmarks/$$b || rc=1; \
	done; \
	[ $$rc = 0 ] || { echo "make bench: a goal was missed or a benchmark failed (see above)" >&2; exit 1; }

clean:
	rm -rf $(DIST) .pytest_cache .ruff_cache
