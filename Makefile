# Every target does its own set-up on a fresh machine: a .venv with torch pinned (constraints.txt).
PYTHON ?= python3
# Where torch comes from.  Empty: pip's own index, which serves the pinned version's CPU wheel where
# one is on offer, and from pypi.org alone the CUDA build (~2.5 GB with its nvidia packages).
# TORCH_INDEX=https://download.pytorch.org/whl/cpu takes PyTorch's CPU-only wheel (~200 MB) first.
TORCH_INDEX ?=
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TA_STAMP := $(VENV)/.torchaudio-cpu

.PHONY: demo test install clean

install: $(STAMP) $(TA_STAMP)

# setup.py and the C source too: the editable install compiles wdsprep/_native.c into the tree.
$(STAMP): pyproject.toml constraints.txt setup.py wdsprep/_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH_INDEX),$(PY) -m pip install -q --no-compile -c constraints.txt torch --index-url $(TORCH_INDEX))
	$(PY) -m pip install -q --no-compile -c constraints.txt -e '.[test,lhotse,hf,lightning,opus,cluster]'
	@# pip byte-compiles what it installs one file at a time (35 of its 60 s here); on every core, 15.
	$(PY) -m compileall -qq -j 0 $(VENV)/lib > /dev/null || true
	touch $@

# torchaudio's Linux wheels are CUDA-linked, so on CPU torch `import torchaudio` fails; without
# its compiled extension (torchaudio/lib/*.so) the pure-Python compliance.kaldi.fbank imports and
# runs. That gives the fbank 'torchaudio' backend, and the test comparing it with
# kaldi-native-fbank. Optional: if this step fails the backend is unavailable and that test skips.
$(TA_STAMP): $(STAMP)
	-$(PY) -m pip install -q --no-deps -c constraints.txt 'torchaudio==2.11.0' && \
	  $(PY) -c "import pathlib, importlib.util as u; d = pathlib.Path(u.find_spec('torchaudio').origin).parent / 'lib'; [p.unlink() for p in d.glob('*.so')]" && \
	  $(PY) -c "import torchaudio.compliance.kaldi" || echo "torchaudio unavailable: its fbank backend and tests will be skipped"
	touch $@

# The main job on the bundled real-speech corpus: fbank -> pack -> tokenizer -> dry-run on 1 and 2 ranks.
demo: $(STAMP) $(TA_STAMP)
	$(PY) tools/demo.py --work exp/demo

# Three pytest processes share two cores (pytest-xdist; an idle one takes tests from another, so a
# module's fixtures may be built in more than one): the third runs while the others wait on a
# server's trickle, a timeout or torchrun's start-up. The tests that time things or watch the page
# cache run alone afterwards.
TEST_JOBS ?= 3
# pytest's status 5 ("no tests collected") is a failure only when neither part ran a test: a
# PYTEST_ARGS selection may fall wholly in one part.
test: $(STAMP) $(TA_STAMP)
	@# Compiled once here, not in every process the tests start (which may not write bytecode).
	@$(PY) -m compileall -qq wdsprep tests egs tools > /dev/null
	@par=0; ser=0; \
	echo "== the suite, in $(TEST_JOBS) processes"; \
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal -m "not serial" --durations=15 $(PYTEST_ARGS) || par=$$?; \
	echo "== the serial tests, alone"; \
	$(PY) -m pytest -q -m serial $(PYTEST_ARGS) || ser=$$?; \
	for s in $$par $$ser; do [ $$s -eq 0 ] || [ $$s -eq 5 ] || exit $$s; done; \
	[ $$par -ne 5 ] || [ $$ser -ne 5 ] || exit 5

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache wdsprep/*.so
