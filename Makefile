# asyncpp - build, test, demo, install.
#
#   make            build ./asyncpp (CUDA objects too when nvcc is found),
#                   one job per core (make -j1: one at a time)
#   make CUDA=0     CPU only
#   make test       install missing packages, build, run the test suite
#   make demo       install missing packages, tokenize/train/eval/sample
#   make asan       the test suite under AddressSanitizer + UBSan
#   make fuzz       libFuzzer on every reader's entry point (needs clang)
#   make bench      benchmarks (tokenizer, training step, schedules)
#   make install PREFIX=/usr/local
#
# Adding a source file needs no change here: every .c under the module
# folders is part of the library; tests/unit/*.c each become a test binary.

PREFIX ?= /usr/local
CC ?= cc
# Parallel by default, one job per core; a -j on the command line wins.
# Only the top make adds it, and only when no -j was given: a sub-make
# shares its parent's jobs (make -j1 test stays one job; a -j of its own
# would start another job server, with make's 'resetting jobserver mode'
# warning), and a make that cleans runs its goals one at a time (make clean
# all would build while it removes).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
ifeq ($(MAKELEVEL)$(filter clean,$(MAKECMDGOALS))$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(JOBS)
endif
BUILD ?= build
BIN ?= asyncpp
# -march=native tunes for this machine's CPU; a build made for another
# machine (DEPS_PREFIX, below: the GPU kit) targets x86-64-v3 (AVX2, FMA)
# instead, which every GPU server of the last decade has.
ifeq ($(DEPS_PREFIX),)
OPT ?= -O3 -march=native
else
OPT ?= -O3 -march=x86-64-v3
endif
CFLAGS ?= $(OPT) -g
WARN = -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare -Wpointer-arith
# DEPS_PREFIX=DIR takes zstd, zlib, inih and OpenBLAS from the folder that
# tools/gpu-deps unpacks (DIR/include, DIR/lib), for machines without them.
DEPS_PREFIX ?=
ifneq ($(DEPS_PREFIX),)
BLAS_INC := -I$(DEPS_PREFIX)/include -I$(DEPS_PREFIX)/include/openblas
STATIC_LIBS = $(addprefix $(DEPS_PREFIX)/lib/,libzstd.a libz.a libinih.a libopenblas.a \
	libgfortran.a libquadmath.a)
else
BLAS_INC := $(shell pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread)
BLAS_DIR := $(shell pkg-config --variable=libdir openblas 2>/dev/null || echo /usr/lib/x86_64-linux-gnu/openblas-pthread)
# zstd, zlib, inih and OpenBLAS link statically when their archives exist.
STATIC_LIBS = $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libzstd.a) -lzstd) \
	$(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libz.a) -lz) \
	$(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libinih.a) -linih) \
	$(firstword $(wildcard $(BLAS_DIR)/libopenblas.a) -lopenblas) -lgfortran
endif
# PCRE2 (a tokenizer.json's Split regex without a scanner of its own) links
# statically when its archive and header exist (libpcre2-dev; the GPU kit's
# DEPS_PREFIX); without them asyncpp refuses such a regex, saying why.
PCRE2_DIR := $(if $(DEPS_PREFIX),$(DEPS_PREFIX)/lib,/usr/lib/x86_64-linux-gnu)
PCRE2_H := $(if $(DEPS_PREFIX),$(DEPS_PREFIX)/include,/usr/include)/pcre2.h
PCRE2_LIB := $(if $(wildcard $(PCRE2_H)),$(wildcard $(PCRE2_DIR)/libpcre2-8.a))
STATIC_LIBS += $(PCRE2_LIB)
ALL_CFLAGS = -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -fopenmp -fno-math-errno \
	$(WARN) $(BLAS_INC) $(if $(PCRE2_LIB),-DASYNCPP_PCRE2) $(CFLAGS) $(EXTRA_CFLAGS)
LDLIBS = $(STATIC_LIBS) -lpthread -lm -ldl -fopenmp $(EXTRA_LDLIBS)

# ---- CUDA (optional) ----
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(NVCC),)
CUDA ?= 0
else
CUDA ?= 1
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# The H100's code (sm_90) and its PTX, which the driver compiles for newer
# GPUs; an A100 needs its own: NVCC_GENCODE="-gencode=arch=compute_80,code=sm_80
# -gencode=arch=compute_90,code=sm_90" (--threads 0 compiles the two at once).
NVCC_GENCODE ?= -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90
NVCC_FLAGS ?= -O3 -std=c++17 $(NVCC_GENCODE) --threads 0 --expt-relaxed-constexpr
# the longest to compile first, so that they do not finish last
CU_FIRST = $(wildcard $(addprefix kernels/cuda/,cuda_flash.cu cuda_matmul.cu cuda_attention.cu \
	cuda_optim.cu cuda_elementwise.cu))
CU_SRC = $(CU_FIRST) $(filter-out $(CU_FIRST),$(wildcard kernels/cuda/*.cu))
ifeq ($(CUDA),1)
CU_OBJ = $(CU_SRC:%.cu=$(BUILD)/%.o)
# cuDNN's attention graphs (plain C against cuDNN's headers; cuDNN itself is
# loaded with dlopen, see kernels/cuda/cudnn_sdpa.h)
CU_OBJ += $(BUILD)/kernels/cuda/cudnn_sdpa.o $(BUILD)/kernels/cuda/cudnn_sdpa_graph.o
ALL_CFLAGS += -DASYNCPP_CUDA=1
# cudart links statically; it finds the driver (libcuda) at run time, so the
# binary starts where there is none. cuBLAS and NCCL are loaded with dlopen.
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -lstdc++
endif

# ---- MPI (optional): multi-process pipelines, mpirun -np S asyncpp train ----
# Found through pkg-config (ompi-c, then mpi) or mpicc --showme; MPI=0 builds
# without it (sched/*_mpi.c then compile to stubs that report the fact).
MPI_PC := $(firstword $(foreach p,ompi-c mpi,$(shell pkg-config --exists $(p) 2>/dev/null && echo $(p))))
ifneq ($(MPI_PC),)
MPI_CFLAGS ?= $(shell pkg-config --cflags $(MPI_PC))
MPI_LIBS ?= $(shell pkg-config --libs $(MPI_PC))
else ifneq ($(shell mpicc --showme:link 2>/dev/null),)
MPI_CFLAGS ?= $(shell mpicc --showme:compile)
MPI_LIBS ?= $(shell mpicc --showme:link)
endif
ifneq ($(MPI_LIBS),)
MPI ?= 1
else
MPI ?= 0
endif
ifeq ($(MPI),1)
ALL_CFLAGS += -DASYNCPP_MPI=1 $(MPI_CFLAGS)
LDLIBS += $(MPI_LIBS)
endif
# ---- end MPI ----

LIB_SRC = $(wildcard io/*.c io/*/*.c model/*.c model/*/*.c kernels/*.c kernels/cpu/*.c optim/*.c sched/*.c sched/*/*.c cmd/*.c)
CORPUS = $(sort $(wildcard testdata/corpus/*.txt))
MANPAGES = $(sort $(wildcard man/*.1 man/*.5 man/*.7))
LIB_OBJ = $(CU_OBJ) $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/corpus.o $(BUILD)/gen/manpages.o
TEST_SRC = $(wildcard tests/unit/*.c)
TEST_BIN = $(TEST_SRC:%.c=$(BUILD)/%)
FUZZ_SRC = $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN = $(FUZZ_SRC:%.c=$(BUILD)/%)

.PHONY: all deps test check demo asan bench install clean test-cuda test-faults fuzz fuzz-run
all: $(BIN)

$(BIN): $(BUILD)/asyncpp.o $(BUILD)/libasyncpp.a
	$(CC) -o $@ $^ $(LDLIBS)

$(BUILD)/libasyncpp.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# the built-in corpus, compiled into the binary
$(BUILD)/gen/corpus.c: $(CORPUS) tools/embed_files.sh
	@mkdir -p $(dir $@)
	sh tools/embed_files.sh $@ builtin_corpus $(CORPUS)

# the man pages, compiled in for `asyncpp help COMMAND` before installing
$(BUILD)/gen/manpages.c: $(MANPAGES) tools/embed_files.sh
	@mkdir -p $(dir $@)
	sh tools/embed_files.sh $@ builtin_manpages $(MANPAGES)

$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(CC) $(ALL_CFLAGS) -I$(CURDIR) -O0 -c -o $@ $<

# Objects depend on the flags they were built with: switching CUDA=, MPI=
# or OPT= rebuilds them instead of linking stale ones.
$(BUILD)/.flags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(CC) $(ALL_CFLAGS) $(NVCC_FLAGS)' | cmp -s - $@ || echo '$(CC) $(ALL_CFLAGS) $(NVCC_FLAGS)' > $@
FORCE:
.PHONY: FORCE

$(BUILD)/%.o: %.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/%.o: %.cu $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -I. -MMD -MP -MF $(@:.o=.d) -c -o $@ $<

$(BUILD)/tests/unit/%: tests/unit/%.c $(BUILD)/tests/harness.o $(BUILD)/libasyncpp.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -MF $@.d -o $@ $< $(BUILD)/tests/harness.o $(BUILD)/libasyncpp.a $(LDLIBS)

# test_cudnn_graph builds cuDNN's attention graphs against a fake libcudnn
# (tests/unit/fixtures/fake_cudnn.c; a second copy lacks cudnnBackendExecute)
# with cuDNN's headers; without them the test skips.
# CUDNN_INC=-IDIR names another folder with cudnn_graph.h (a build without
# the headers runs the flash kernels where cudnn is asked for, saying so).
CUDNN_INC ?= $(if $(wildcard $(CUDA_HOME)/include/cudnn_graph.h),-I$(CUDA_HOME)/include)
$(BUILD)/kernels/cuda/cudnn_sdpa.o $(BUILD)/kernels/cuda/cudnn_sdpa_graph.o: \
	EXTRA_CFLAGS += $(CUDNN_INC)
$(BUILD)/tests/unit/test_cudnn_graph: EXTRA_CFLAGS += $(CUDNN_INC)
ifneq ($(CUDNN_INC),)
$(BUILD)/tests/unit/test_cudnn_graph: $(BUILD)/tests/fake_cudnn.so $(BUILD)/tests/fake_cudnn_noexec.so
endif
$(BUILD)/tests/fake_cudnn.so: tests/unit/fixtures/fake_cudnn.c tests/unit/fixtures/fake_cudnn.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(WARN) -O1 -shared -fPIC $(CUDNN_INC) -o $@ $<
$(BUILD)/tests/fake_cudnn_noexec.so: tests/unit/fixtures/fake_cudnn.c tests/unit/fixtures/fake_cudnn.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(WARN) -O1 -shared -fPIC -DFAKE_NO_EXECUTE $(CUDNN_INC) -o $@ $<

$(BUILD)/tests/fuzz/%: tests/fuzz/%.c tests/fuzz/replay.c tests/fuzz/fuzz_file.h $(BUILD)/libasyncpp.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< tests/fuzz/replay.c $(BUILD)/libasyncpp.a $(LDLIBS)

test-bins: $(BIN) $(TEST_BIN) $(FUZZ_BIN)
.PHONY: test-bins

# Install the Debian packages the build and tests need (as root), or say how.
DEB_PACKAGES = build-essential pkg-config libzstd-dev zstd zlib1g-dev libinih-dev libpcre2-dev \
	libopenblas-dev \
	libgfortran-12-dev openmpi-bin libopenmpi-dev nodejs npm bible-kjv bible-kjv-text
deps:
	@sh tests/deps.sh $(DEB_PACKAGES)

test: deps
	$(MAKE) test-bins
	bash tests/run

check: test

asan:
	$(MAKE) BUILD=build-asan BIN=build-asan/asyncpp CUDA=0 \
		OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined" \
		EXTRA_LDLIBS="-fsanitize=address,undefined" test-bins
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
		ASAN_CLI_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		ASYNCPP=build-asan/asyncpp BUILD=build-asan bash tests/run

# libFuzzer (clang) on each tests/fuzz/fuzz_*.c (FUZZ_ONLY=hf_config,shard
# picks some), FUZZ_SECONDS each, from a copy of its saved corpus: new
# inputs land in build-fuzz/corpus/NAME, crashes in build-fuzz/crashes/
# (a crash found goes into tests/fuzz/corpus/NAME once fixed, so that every
# test run replays it). The library is built with ASan + UBSan and coverage.
FUZZ_SECONDS ?= 60
FUZZ_ONLY ?=
FUZZ_SAN = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
fuzz:
	@command -v clang > /dev/null && echo 'int main(void) { return 0; }' | \
		clang -fopenmp -fsanitize=fuzzer-no-link -x c - -o /dev/null 2> /dev/null || \
		{ echo "make fuzz: needs clang with OpenMP (apt-get install clang libomp-dev)"; exit 1; }
	$(MAKE) BUILD=build-fuzz CUDA=0 MPI=0 CC=clang \
		OPT="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" fuzz-run

# (inside make fuzz: BUILD, CC, CUDA=0 and MPI=0 set, so LDLIBS is the CPU's)
fuzz-run: $(BUILD)/libasyncpp.a
	@mkdir -p $(BUILD)/bin $(BUILD)/crashes
	@set -e; for src in $(FUZZ_SRC); do \
		n=$$(basename $$src .c); c=$${n#fuzz_}; \
		case ",$(FUZZ_ONLY)," in ,,|*,$$c,*) ;; *) continue ;; esac; \
		$(CC) -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -fopenmp $(FUZZ_SAN) \
			-fsanitize=fuzzer -o $(BUILD)/bin/$$n $$src $(BUILD)/libasyncpp.a $(LDLIBS); \
		mkdir -p $(BUILD)/corpus/$$c && cp tests/fuzz/corpus/$$c/* $(BUILD)/corpus/$$c/; \
		echo "== $$n: $(FUZZ_SECONDS) s"; \
		$(BUILD)/bin/$$n -max_total_time=$(FUZZ_SECONDS) \
			-artifact_prefix=$(BUILD)/crashes/$$n- $(BUILD)/corpus/$$c \
			> $(BUILD)/$$n.log 2>&1 || { tail -n 40 $(BUILD)/$$n.log; exit 1; }; \
		grep -E '^(#[0-9]+ +DONE|Done)' $(BUILD)/$$n.log | tail -n 1; \
	done

demo: deps
	$(MAKE) all
	bash tests/demo.sh

bench: all
	./asyncpp bench tokenizer
	./asyncpp bench train
	./asyncpp bench schedule --kind 1f1b --stages 4 --micro 8

test-cuda: all
	bash tests/run --cuda

# the fault campaign (tests/faults_campaign.sh): every fault-injecting
# script, with more rounds than make test's (kill -9 and SIGTERM each
# FAULT_ROUNDS times at random steps, SIGTERM to mpirun at
# MPI_SIGTERM_TRIALS random moments), closing on one table
FAULT_ROUNDS ?= 15
MPI_SIGTERM_TRIALS ?= 10
test-faults: all test-bins
	FAULT_ROUNDS=$(FAULT_ROUNDS) MPI_SIGTERM_TRIALS=$(MPI_SIGTERM_TRIALS) \
		bash tests/faults_campaign.sh

install: $(BIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
		$(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man7
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/asyncpp
	install -m 644 man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 man/*.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -m 644 man/*.7 $(DESTDIR)$(PREFIX)/share/man/man7/
	install -d $(DESTDIR)$(PREFIX)/share/bash-completion/completions
	install -m 644 tools/asyncpp-completion.bash \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions/asyncpp

clean:
	rm -rf build build-asan build-fuzz asyncpp

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
