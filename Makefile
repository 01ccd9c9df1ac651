# One entry point for set-up: every target creates .venv and installs what it needs first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NPM_STAMP := tests/interop/node_modules/.installed

.PHONY: serve test lint bench fuzz clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# compat mode puts the checkout on sys.path, so Twisted finds twisted/plugins/ here
	$(BIN)/pip install --quiet -e '.[test,bench,spark]' --config-settings editable_mode=compat
	touch $(STAMP)

# The reference implementations (nydus-protocol, ...) used as real peers in tests.
$(NPM_STAMP): tests/interop/package.json tests/interop/package-lock.json
	cd tests/interop && npm ci --no-audit --no-fund --loglevel=error
	touch $(NPM_STAMP)

# The broker on built-in defaults: WEBSMQ on ws://127.0.0.1:8765/websmq and tcp:127.0.0.1:8766.
serve: $(STAMP)
	$(BIN)/wireproto serve

test: $(STAMP) $(NPM_STAMP)
	$(BIN)/ruff check wireproto tests bench twisted examples
	@# pytest exits 5 when it collects nothing: a suite that tests nothing must fail loudly.
	@$(BIN)/python -m pytest; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check wireproto tests bench twisted examples

bench: $(STAMP)
	$(BIN)/python bench/codecs.py
	$(BIN)/python bench/pubsub.py
	$(BIN)/python bench/rpc.py
	$(BIN)/python bench/phyllo.py
	$(BIN)/python bench/pipeline.py

# Every decoder's fuzz target for FUZZ_SECONDS each (the suite runs them for 1 s). Each keeps its
# corpus in .fuzz/corpus/TARGET, so runs build on each other; a finding is .fuzz/crash-*.
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	@for target in $$($(BIN)/python -c "from tests.fuzz.targets import TARGETS; print(*TARGETS)"); do \
	  mkdir -p .fuzz/corpus/$$target; \
	  echo "fuzz: $$target for $(FUZZ_SECONDS) s"; \
	  $(BIN)/python -m tests.fuzz.run $$target .fuzz/corpus/$$target \
	    -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=.fuzz/ -print_final_stats=1 \
	    2>&1 | grep -E "^(stat::number_of_executed_units|Done|==|SUMMARY)|Error" || true; \
	  if ls .fuzz/crash-* >/dev/null 2>&1; then echo "fuzz: a finding in .fuzz/" >&2; exit 1; fi; \
	done

clean:
	rm -rf $(VENV) tests/interop/node_modules .fuzz
