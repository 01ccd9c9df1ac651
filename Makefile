# One entry point for set-up: every target creates .venv and installs what it needs first.
# `make serve` installs only what the broker needs; `make test` adds the test, bench and Spark
# extras (about 1 GB, pyspark alone about 500 MB).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SERVE_STAMP := $(VENV)/.installed-serve
STAMP  := $(VENV)/.installed
NPM_STAMP := tests/interop/node_modules/.installed
SPEEDUPS_STAMP := $(VENV)/.speedups-built

.PHONY: serve install speedups test lint bench fuzz java mosquitto chromium clean

# The package, editable, and a .pth naming this checkout: twistd finds plugins in the
# twisted/plugins directories of sys.path entries, and this checkout's is at its top.
$(SERVE_STAMP): setup.cfg pyproject.toml setup.py
	@echo "make: creating $(VENV) and installing wireproto (what serving needs)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --progress-bar on --upgrade pip
	$(BIN)/pip install --progress-bar on -e .
	$(BIN)/python -c "import pathlib, site; pathlib.Path(site.getsitepackages()[0], \
	  'wireproto-checkout.pth').write_text(str(pathlib.Path.cwd()) + '\n')"
	touch $(SERVE_STAMP)

install: $(SERVE_STAMP)

# The compiled fast path (wireproto/speedups/_compiled.pyx), built again whenever it changes:
# pip builds it in place, with Cython in its build environment. Without a C compiler the broker
# runs the plain-Python twin; said here, and a failure of `make test` under CI=true.
$(SPEEDUPS_STAMP): $(SERVE_STAMP) wireproto/speedups/_compiled.pyx
	$(BIN)/pip install --progress-bar off --no-deps -e .
	@$(BIN)/python -c "import wireproto.speedups as s; print('make: the fast path is', \
	  'compiled' if s.compiled_available() else 'NOT compiled (no C compiler?): plain Python')"
	touch $(SPEEDUPS_STAMP)

speedups: $(SPEEDUPS_STAMP)

$(STAMP): $(SERVE_STAMP)
	@echo "make: installing the test, bench and spark extras (about 1 GB)"
	$(BIN)/pip install --progress-bar on -e '.[test,bench,spark]'
	touch $(STAMP)

# The reference implementations (nydus-protocol, ...) used as real peers in tests.
$(NPM_STAMP): tests/interop/package.json tests/interop/package-lock.json
	cd tests/interop && npm ci --no-audit --no-fund --loglevel=error
	touch $(NPM_STAMP)

# The broker on built-in defaults: WEBSMQ on ws://127.0.0.1:8765/websmq and tcp:127.0.0.1:8766.
serve: $(SERVE_STAMP) $(SPEEDUPS_STAMP)
	$(BIN)/wireproto serve

# Debian packages: installed when missing and root, else named, and the target fails.
# $(1) the command to look for (also in /usr/sbin), $(2) the package, $(3) what it is for.
define debian_package
	@if ! PATH="$$PATH:/usr/sbin:/usr/local/sbin" command -v $(1) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing $(2) for $(3)"; \
	    apt-get update -q && apt-get install -y -q $(2); \
	  else \
	    echo "make: $(1) is missing, needed for $(3); install it: apt-get install $(2)" >&2; \
	    exit 1; \
	  fi; \
	fi
endef

# Spark's tests need Java 17.
java:
	$(call debian_package,java,openjdk-17-jre-headless,Spark)

# The pub/sub benchmark runs mosquitto beside wireproto, and its test drives it; the command
# line's benchmark times mosquitto_pub beside wireproto pub.
mosquitto:
	$(call debian_package,mosquitto,mosquitto,the pub/sub benchmark)
	$(call debian_package,mosquitto_pub,mosquitto-clients,the command line's benchmark)

# The status page's tests and benchmark drive Debian's headless Chromium (Playwright, from the
# test extras, is pointed at /usr/bin/chromium; it downloads no browser).
chromium:
	$(call debian_package,chromium,chromium chromium-driver,the browser tests)

test: $(STAMP) $(SPEEDUPS_STAMP) $(NPM_STAMP) java mosquitto chromium
	$(BIN)/ruff check wireproto tests bench twisted examples
	$(BIN)/mypy wireproto
	@# pytest exits 5 when it collects nothing: a suite that tests nothing must fail loudly.
	@$(BIN)/python -m pytest; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check wireproto tests bench twisted examples
	$(BIN)/mypy wireproto

bench: $(STAMP) $(SPEEDUPS_STAMP) mosquitto chromium
	$(BIN)/python bench/codecs.py
	$(BIN)/python bench/cli.py
	$(BIN)/python bench/pubsub.py
	$(BIN)/python bench/rpc.py
	$(BIN)/python bench/phyllo.py
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/last_values.py
	$(BIN)/python bench/statuspage.py

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
