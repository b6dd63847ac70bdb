# Two entry points a new user needs: `make demo` and `make test`.
# Each creates .venv with torch pinned (the build the pip index serves for the pin: a
# local CPU wheel on this project's CI machines); TORCH_SPEC takes another requirement. No pip cache: the venv
# alone is about 2.4 GB, and a cached copy of every download doubled the disk it needed.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.rayshard-installed

.PHONY: demo example-images example-text example-mix example-lightning test test-submit lint bench plan clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --no-cache-dir --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check --no-cache-dir "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check --no-cache-dir -e '.[test]'
	touch $@

demo: $(STAMP)
	$(PY) examples/train.py

example-images: $(STAMP)
	$(PY) examples/train_images.py

example-text: $(STAMP)
	$(PY) examples/train_text.py

# Two stdlib text sources (code, docstrings) mixed 0.7/0.3, a tiny byte-level LM, audit.
example-mix: $(STAMP)
	$(PY) examples/pretrain_mix.py

# PyTorch Lightning under Ray Train over rayshard: 3 epochs, per-epoch coverage table.
example-lightning: $(STAMP)
	$(PY) examples/train_lightning.py

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -m "not submit" -n 2 --dist worksteal --durations=15 || [ $$? -eq 5 ]

# `ray up` + `ray submit` of the demo and, on the same cluster, the three transform and
# packing examples on small data (their smoke test: each must print its OK line), `ray down`.
test-submit: $(STAMP)
	bash tests/e2e/run_submit.sh \
	  --then 'examples/train_images.py|rayshard images: OK|--samples=300 --epochs=1' \
	  --then 'examples/train_text.py|rayshard text: OK|--max-bytes=60000 --epochs=1' \
	  --then 'examples/pretrain_mix.py|rayshard mix: OK|--modules=3 --epochs=1 --workers=1'

bench: $(STAMP)
	$(PY) -m benchmarks

plan: $(STAMP)
	$(VENV)/bin/rayshard plan --samples 10 --world-size 2 --batch-size 2 --epochs 2

clean:
	rm -rf $(VENV) build *.egg-info
