# moex: see README.md.
GO      ?= go
BIN     ?= moex
# Packages with goroutines of their own, run again under the race detector.
RACE_PKGS = ./moe/...

.PHONY: all build run test check vet fmt-check race bench fuzz golden clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/moex

# The main job on its built-in defaults.
run: build
	./$(BIN) run

# Everything CI checks.
test: check
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race $(RACE_PKGS)
	$(GO) test -count=1 -run '^$$' -bench . -benchtime=1x ./...

check: fmt-check vet

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Benchmarks, for real: compare runs with benchstat.
bench:
	$(GO) test -run '^$$' -bench . -benchtime=2s -count=5 ./...

# A short fuzzing session of the safetensors header parser.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseHeader -fuzztime 60s ./moe

# Regenerate testdata/moe from the float64 reference.
golden:
	$(GO) test ./moe -run TestGoldenGenerate -update

clean:
	rm -f $(BIN)
