# `make serve`, `make test` and `make bench`. Each installs what it needs first: serving
# needs omlx, the default model and OpenBLAS (scripts/setup.sh); the tests add their tools,
# PostgreSQL, Chromium, haproxy, nginx and the agent CLIs (scripts/setup-test.sh).
.PHONY: serve test test-slow bench lint clean

STAMP := .venv/.omlx-installed
TEST_STAMP := .venv/.omlx-test-installed

$(STAMP): pyproject.toml scripts/setup.sh scripts/apt.sh
	./scripts/setup.sh
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) scripts/setup-test.sh scripts/install-agents.sh
	./scripts/setup-test.sh
	touch $(TEST_STAMP)

serve: $(STAMP)
	.venv/bin/omlx serve $(ARGS)

# The linter first: ruff's findings and any file the formatter would change fail the run.
lint: $(TEST_STAMP)
	.venv/bin/ruff check src tests bench migrations
	.venv/bin/ruff format --check src tests bench migrations

test: lint
	.venv/bin/python -m pytest -q $(ARGS)

# The benchmark set (docs/benchmarks.md): the `bench` extra, llama.cpp's server where it
# builds (skipped with a note otherwise), then each bench in turn. BENCH_QUICK=1 for a
# short pass; ARGS="--only agent_loop,restore" for a subset.
BENCH_STAMP := .venv/.omlx-bench-installed

$(BENCH_STAMP): $(STAMP)
	.venv/bin/python -m pip install -q -e ".[test,vision,bench]"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	./scripts/install-llama-cpp.sh || echo "note: llama.cpp's server could not be built; the benches run without it"
	.venv/bin/python bench/run_all.py $(if $(filter 1,$(BENCH_QUICK)),--quick) $(ARGS)

test-slow: $(TEST_STAMP)
	.venv/bin/python -m pytest -q -m slow $(ARGS)

clean:
	rm -rf .venv build *.egg-info .pytest_cache
