package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moex-project/moex/router"
)

// workerList is a repeatable --worker flag.
type workerList []string

func (w *workerList) String() string     { return strings.Join(*w, ",") }
func (w *workerList) Set(v string) error { *w = append(*w, v); return nil }

// cmdRoute is `moex route`: the router, until SIGTERM or SIGINT, which
// drain it.
func cmdRoute(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return routeUntil(ctx, args, stdout, stderr)
}

// routeUntil runs the router until ctx ends, then lets the requests in
// flight finish (up to --shutdown-timeout).
func routeUntil(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	d := router.Defaults()
	fs := flag.NewFlagSet("route", flag.ContinueOnError)
	var workers workerList
	fs.Var(&workers, "worker", "a worker's URL (repeat for each); more come through POST /workers")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 30000, "port to listen on (0: any free one, printed)")
	policy := fs.String("policy", d.Policy, "cache_aware, round_robin, random, power_of_two, least_load or consistent_hash")
	fs.Float64Var(&d.Threshold, "cache-threshold", d.Threshold, "cache_aware: a match rate above it is a hit")
	fs.Float64Var(&d.BalanceAbs, "balance-abs-threshold", d.BalanceAbs, "cache_aware: imbalanced when max − min load is above it…")
	fs.Float64Var(&d.BalanceRel, "balance-rel-threshold", d.BalanceRel, "…and max is above min × it")
	fs.Float64Var(&d.SpillAbs, "spill-abs-threshold", d.SpillAbs, "cache_aware: a hit spills when its worker's load is above mean + it…")
	fs.Float64Var(&d.SpillRel, "spill-rel-threshold", d.SpillRel, "…and above mean × it")
	fs.IntVar(&d.MaxTreeBytes, "max-tree-size", d.MaxTreeBytes, "the tree's budget, bytes of text for all workers together")
	fs.DurationVar(&d.EvictionInterval, "eviction-interval", d.EvictionInterval, "between periodic evictions from the tree")
	fs.DurationVar(&d.HealthInterval, "health-check-interval", d.HealthInterval, "between health checks of each worker")
	fs.DurationVar(&d.HealthTimeout, "health-check-timeout", d.HealthTimeout, "one health check's limit")
	fs.IntVar(&d.HealthFailures, "health-failure-threshold", d.HealthFailures, "failed checks in a row that take a worker out")
	fs.IntVar(&d.HealthSuccesses, "health-success-threshold", d.HealthSuccesses, "passed checks in a row that bring it back")
	fs.DurationVar(&d.StartupTimeout, "worker-startup-timeout", d.StartupTimeout, "how long a worker may take to answer /health when added")
	fs.IntVar(&d.Retries, "retries", d.Retries, "further attempts on other workers for requests whose response has not started")
	fs.DurationVar(&d.BackoffInitial, "retry-initial-backoff", d.BackoffInitial, "the first retry's wait (×1.5 each, ±20 %)")
	fs.DurationVar(&d.BackoffMax, "retry-max-backoff", d.BackoffMax, "the longest wait between retries")
	fs.IntVar(&d.BreakerFailures, "cb-failure-threshold", d.BreakerFailures, "failed requests in a row that open a worker's circuit (0: no breaker)")
	fs.IntVar(&d.BreakerSuccesses, "cb-success-threshold", d.BreakerSuccesses, "successes in a row that close it again")
	fs.DurationVar(&d.BreakerTimeout, "cb-timeout", d.BreakerTimeout, "how long a circuit stays open before a trial request")
	fs.StringVar(&d.RoutingKeyHeader, "routing-key-header", d.RoutingKeyHeader, "consistent_hash: the header whose value is the key (else the text)")
	shutdown := fs.Duration("shutdown-timeout", 30*time.Second, "on SIGTERM, how long requests in flight may take to finish")
	model := fs.String("model", "", "a model folder or GGUF file: chat requests are matched on the prompt its chat template renders, as the workers render it (else on their messages' contents)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	d.Policy = *policy
	if *model != "" {
		text, err := loadText(*model, true)
		if err != nil {
			return fmt.Errorf("route: %w", err)
		}
		d.ChatText = text.chatText
	}
	switch {
	case *port < 0 || *port > 65535:
		return fmt.Errorf("%w: route: --port %d must be in [0, 65535] (0: any free port)", errUsage, *port)
	case *shutdown <= 0:
		return fmt.Errorf("%w: route: --shutdown-timeout %v must be positive", errUsage, *shutdown)
	}
	r, err := router.New(d)
	if err != nil {
		return fmt.Errorf("%w: route: %v", errUsage, err)
	}
	// The workers given, each once its /health answers.
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() { errs[i] = r.AddWorker(ctx, w) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, fmt.Sprint(*port)))
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	bg, stopBG := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { r.Run(bg) })
	srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "moex route: %s over %d workers on http://%s\n", d.Policy, len(workers), ln.Addr())
	select {
	case <-ctx.Done():
	case err = <-served:
	}
	sctx, cancel := context.WithTimeout(context.Background(), *shutdown)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil && err == nil {
		err = fmt.Errorf("route: draining: %w", serr)
	}
	stopBG()
	loops.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	fmt.Fprintln(stdout, "moex route: stopped")
	return err
}
