# Two commands: `make serve` and `make test`. Both install everything first.
.PHONY: serve test test-slow bench lint clean

STAMP := .venv/.omlx-installed

$(STAMP): pyproject.toml scripts/setup.sh
	./scripts/setup.sh
	touch $(STAMP)

serve: $(STAMP)
	.venv/bin/omlx serve $(ARGS)

test: $(STAMP)
	.venv/bin/python -m pytest -q $(ARGS)

test-slow: $(STAMP)
	.venv/bin/python -m pytest -q -m slow $(ARGS)

clean:
	rm -rf .venv build *.egg-info .pytest_cache
