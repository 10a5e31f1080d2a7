# Two entry points, both from a fresh clone with only python3 and make:
#   make demo   set up and run the demo (simulated engines + gateway + dashboard); PORT=N moves it off 8080
#   make test   set up and run the whole test suite (ruff, mypy --strict, pytest)
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: demo test lint unit versions bench soak clean

# The editable install builds the compiled core in place (setup.py; Cython comes with the build).
$(VENV)/.installed: pyproject.toml setup.py $(wildcard kvgateway/*/*.pyx)
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(BIN)/kvgateway --version
	touch $@

demo: $(VENV)/.installed
	$(BIN)/kvgateway demo$(if $(PORT), --port $(PORT))

lint: $(VENV)/.installed
	$(BIN)/ruff check kvgateway tests bench
	$(BIN)/ruff format --check kvgateway tests bench
	$(BIN)/mypy

# Three workers, a test file each at a time (a file's module fixtures stay on its worker; the files
# of tests/integration/web go out as one, since they share its gateways: tests/conftest.py). Most
# tests wait on real processes (engines, gateways, Chromium, nats-server), so a third worker on two
# cores fills those waits: at b043ccb, on a quiet two-core machine, the first run took 11:31 on two
# workers and 8:39 on three. The files go out in the order they are collected
# (--no-loadscope-reorder): the slow directories first and the unit files, many and quick, last,
# where they even out the workers' ends. xdist's default order, most tests first, sent the files of
# one or a few long tests (the artifact build, the demo fleet, the backlog) last, where one worker
# ran them while the others had nothing left. The whole suite runs on the compiled core; the unit
# suite (the differential tests among it) again on the pure one.
test: lint
	$(BIN)/kvgateway --version
	$(BIN)/pytest -q -ra -n 3 --dist loadfile --no-loadscope-reorder
	KVGATEWAY_NO_EXTENSIONS=1 $(BIN)/pytest -q -n 2 tests/unit

unit: $(VENV)/.installed
	$(BIN)/pytest -q tests/unit

# The unit suite (the differential tests among it) on both cores under every other CPython this
# package supports that is on the PATH: the compiled core reads and writes an int's digits where
# CPython's layout differs by version (kvgateway/_pylong.pxd), and msgspec's nesting limit moves
# with the interpreter. Each gets its own venv, .venv-3.12 and on (not part of `make test`: a
# build and two runs of the unit suite each, about 4 minutes on two cores).
VERSIONS ?= 3.12 3.13
versions:
	@for v in $(VERSIONS); do \
	  if ! command -v python$$v >/dev/null 2>&1; then echo "python$$v: not found, skipped"; continue; fi; \
	  stale=$$(find setup.py pyproject.toml kvgateway \( -name '*.pyx' -o -name '*.pxd' -o -name setup.py -o -name pyproject.toml \) -newer .venv-$$v/.installed 2>/dev/null | head -1); \
	  if [ ! -f .venv-$$v/.installed ] || [ -n "$$stale" ]; then \
	    { [ -d .venv-$$v ] || python$$v -m venv .venv-$$v; } && .venv-$$v/bin/python -m pip install --quiet -e '.[test]' && touch .venv-$$v/.installed || exit 1; \
	  fi; \
	  .venv-$$v/bin/kvgateway --version && .venv-$$v/bin/pytest -q -n 2 -p no:cacheprovider tests/unit || exit 1; \
	  KVGATEWAY_NO_EXTENSIONS=1 .venv-$$v/bin/pytest -q -n 2 -p no:cacheprovider tests/unit || exit 1; \
	done

bench: $(VENV)/.installed
	$(PY) -m bench

soak: $(VENV)/.installed
	$(PY) -m bench.soak

clean:
	rm -rf $(VENV) .venv-3.* build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache test-artifacts
	find kvgateway \( -name '*.so' -o -name '*_c.c' \) -delete
