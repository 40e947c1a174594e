// Package loadgen drives a serving endpoint the way SGLang's bench_serving
// does: a dataset of prompts (groups sharing a system prompt, or random
// ones), sent at a Poisson rate or all at once under a concurrency limit,
// each streamed from POST /generate; it reports request and token
// throughput, time to first token, time per output token, inter-token and
// end-to-end latency percentiles, failures, and the prefix-cache hit rate
// the server reports per request (meta_info.cached_tokens).
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Prompt is one request of a dataset.
type Prompt struct {
	Text      string
	OutputLen int // max_new_tokens, with ignore_eos
	Group     int // its system prompt's group (-1: none)
}

// MaxTokens bounds a dataset's prompt lengths and counts, so that a typo
// is refused before gigabytes are made.
const MaxTokens = 1 << 20

// words makes n bytes of lowercase words: one token a byte for the byte
// presets, and plain text for any other tokenizer.
func words(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		if i > 0 && b[i-1] != ' ' && rng.IntN(6) == 0 {
			b[i] = ' '
		} else {
			b[i] = byte('a' + rng.IntN(26))
		}
	}
	return string(b)
}

// SharedPrefix is SGLang's generated-shared-prefix dataset: groups system
// prompts of systemLen tokens, each followed by perGroup questions of
// questionLen tokens, every request asking for outputLen tokens, in a
// shuffled order. zipf > 1 draws each request's group from a Zipf law of
// that exponent instead (a few hot groups), keeping the count.
func SharedPrefix(groups, perGroup, systemLen, questionLen, outputLen int, zipf float64, seed uint64) ([]Prompt, error) {
	switch {
	case groups < 1 || perGroup < 1:
		return nil, fmt.Errorf("loadgen: %d groups of %d prompts: both must be positive", groups, perGroup)
	case systemLen < 0 || questionLen < 1 || systemLen+questionLen > MaxTokens:
		return nil, fmt.Errorf("loadgen: a system prompt of %d tokens and questions of %d: want ≥ 0 and ≥ 1, %d in all at most", systemLen, questionLen, MaxTokens)
	case outputLen < 1 || outputLen > MaxTokens:
		return nil, fmt.Errorf("loadgen: output length %d must be in [1, %d]", outputLen, MaxTokens)
	case groups*perGroup > MaxTokens || float64(groups)*float64(perGroup)*float64(systemLen+questionLen) > 1<<30:
		return nil, fmt.Errorf("loadgen: %d × %d prompts of %d tokens are too many", groups, perGroup, systemLen+questionLen)
	case zipf != 0 && !(zipf > 1):
		return nil, fmt.Errorf("loadgen: zipf exponent %v must be > 1 (0: every group alike)", zipf)
	}
	rng := rand.New(rand.NewPCG(seed, 0x676e6c))
	system := make([]string, groups)
	for g := range system {
		system[g] = words(rng, systemLen)
	}
	var z *rand.Zipf
	if zipf > 1 {
		z = rand.NewZipf(rng, zipf, 1, uint64(groups-1))
	}
	out := make([]Prompt, 0, groups*perGroup)
	for i := 0; i < groups*perGroup; i++ {
		g := i / perGroup
		if z != nil {
			g = int(z.Uint64())
		}
		out = append(out, Prompt{Text: system[g] + words(rng, questionLen), OutputLen: outputLen, Group: g})
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out, nil
}

// Random is SGLang's random dataset: n prompts of lengths drawn uniformly
// from [inputLen·rangeRatio, inputLen] and outputs from
// [outputLen·rangeRatio, outputLen].
func Random(n, inputLen, outputLen int, rangeRatio float64, seed uint64) ([]Prompt, error) {
	switch {
	case n < 1 || n > MaxTokens:
		return nil, fmt.Errorf("loadgen: %d prompts: want 1 to %d", n, MaxTokens)
	case inputLen < 1 || inputLen > MaxTokens || outputLen < 1 || outputLen > MaxTokens:
		return nil, fmt.Errorf("loadgen: input length %d and output length %d must be in [1, %d]", inputLen, outputLen, MaxTokens)
	case float64(n)*float64(inputLen) > 1<<30:
		return nil, fmt.Errorf("loadgen: %d prompts of %d tokens are too many", n, inputLen)
	case !(rangeRatio >= 0 && rangeRatio <= 1):
		return nil, fmt.Errorf("loadgen: range ratio %v must be in [0, 1]", rangeRatio)
	}
	rng := rand.New(rand.NewPCG(seed, 0x72616e64))
	draw := func(hi int) int {
		lo := max(1, int(math.Ceil(float64(hi)*rangeRatio)))
		return lo + rng.IntN(hi-lo+1)
	}
	out := make([]Prompt, n)
	for i := range out {
		out[i] = Prompt{Text: words(rng, draw(inputLen)), OutputLen: draw(outputLen), Group: -1}
	}
	return out, nil
}

// Config is how a run sends its prompts.
type Config struct {
	URL         string   // the server (or router): POST URL/generate
	MoreURLs    []string // more of them: request i goes to the (i mod n)th of URL and these
	Rate        float64  // requests per second, Poisson arrivals; +Inf (or 0) all at once
	Concurrency int      // requests in flight at most (0: no limit)
	InputIDs    bool     // send the prompt's bytes as input_ids instead of text
	Seed        uint64   // the arrivals' random stream
	Timeout     time.Duration
	Progress    io.Writer // a progress line, rewritten in place (nil: none)
	Client      *http.Client
}

// Result is one request's outcome.
type Result struct {
	OK           bool
	Err          string
	PromptTokens int
	OutputTokens int
	CachedTokens int
	TTFT, E2E    time.Duration
	ITL          []time.Duration // between consecutive token frames
}

// Percentiles of a latency, in milliseconds.
type Percentiles struct {
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
}

// Report is a run's figures.
type Report struct {
	Requests          int         `json:"requests"`
	Completed         int         `json:"completed"`
	Failed            int         `json:"failed"`
	Duration          float64     `json:"duration_s"` // first send to last end
	InputTokens       int         `json:"input_tokens"`
	OutputTokens      int         `json:"output_tokens"`
	CachedTokens      int         `json:"cached_tokens"`
	RequestThroughput float64     `json:"request_throughput"` // completed requests per second
	InputThroughput   float64     `json:"input_throughput"`   // prompt tokens per second
	OutputThroughput  float64     `json:"output_throughput"`  // generated tokens per second
	TotalThroughput   float64     `json:"total_throughput"`
	HitRate           float64     `json:"cache_hit_rate"` // cached prompt tokens / prompt tokens, as the server reports them
	TTFT              Percentiles `json:"ttft"`
	TPOT              Percentiles `json:"tpot"`
	ITL               Percentiles `json:"itl"`
	E2E               Percentiles `json:"e2e_latency"`
	Errors            []string    `json:"errors,omitempty"` // the first few
}

// Run sends prompts to cfg.URL and measures them; it returns when every
// request has ended (or ctx ends, the rest counted as failed).
func Run(ctx context.Context, cfg Config, prompts []Prompt) (Report, error) {
	if len(prompts) == 0 {
		return Report{}, errors.New("loadgen: no prompts")
	}
	if !(cfg.Rate >= 0) {
		return Report{}, fmt.Errorf("loadgen: rate %v must be positive (or inf)", cfg.Rate)
	}
	if cfg.Concurrency < 0 {
		return Report{}, fmt.Errorf("loadgen: concurrency %d must be ≥ 0 (0: no limit)", cfg.Concurrency)
	}
	urls := append([]string{cfg.URL}, cfg.MoreURLs...)
	for _, u := range urls {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return Report{}, fmt.Errorf("loadgen: url %q must begin with http:// or https://", u)
		}
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Timeout: cfg.Timeout}
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x617272))
	results := make([]Result, len(prompts))
	var sem chan struct{}
	if cfg.Concurrency > 0 {
		sem = make(chan struct{}, cfg.Concurrency)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	done, failed := 0, 0
	stopProgress := progress(cfg.Progress, len(prompts), func() (int, int) { mu.Lock(); defer mu.Unlock(); return done, failed })
	start := time.Now()
	next := start
	for i, p := range prompts {
		if cfg.Rate > 0 && !math.IsInf(cfg.Rate, 1) && i > 0 {
			next = next.Add(time.Duration(rng.ExpFloat64() / cfg.Rate * float64(time.Second)))
			if err := sleepUntil(ctx, next); err != nil {
				break
			}
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
		}
		wg.Go(func() {
			r := send(ctx, client, urls[i%len(urls)], cfg.InputIDs, p)
			if sem != nil {
				<-sem
			}
			mu.Lock()
			results[i] = r
			done++
			if !r.OK {
				failed++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	end := time.Now()
	stopProgress()
	for i := range results {
		if !results[i].OK && results[i].Err == "" {
			results[i].Err = "not sent: " + context.Cause(ctx).Error()
		}
	}
	return report(results, end.Sub(start)), nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// progress rewrites a line on w twice a second until the returned stop.
func progress(w io.Writer, total int, counts func() (int, int)) (stop func()) {
	if w == nil {
		return func() {}
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	line := func() {
		d, f := counts()
		fmt.Fprintf(w, "\rbench serve: %d/%d requests done, %d failed", d, total, f)
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				line()
			case <-quit:
				line()
				fmt.Fprintln(w)
				return
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// frame is a streamed /generate frame, the fields read here.
type frame struct {
	OutputIDs []int32 `json:"output_ids"`
	Meta      struct {
		PromptTokens     int             `json:"prompt_tokens"`
		CompletionTokens int             `json:"completion_tokens"`
		CachedTokens     int             `json:"cached_tokens"`
		FinishReason     json.RawMessage `json:"finish_reason"`
	} `json:"meta_info"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// send streams one request and times its tokens.
func send(ctx context.Context, client *http.Client, url string, inputIDs bool, p Prompt) (r Result) {
	body := map[string]any{"sampling_params": map[string]any{"max_new_tokens": p.OutputLen, "temperature": 0, "ignore_eos": true}, "stream": true}
	if inputIDs {
		ids := make([]int32, len(p.Text))
		for i := 0; i < len(p.Text); i++ {
			ids[i] = int32(p.Text[i])
		}
		body["input_ids"] = ids
	} else {
		body["text"] = p.Text
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+"/generate", bytes.NewReader(b))
	if err != nil {
		r.Err = err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		r.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	last, tokens, finished := start, 0, false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			break
		}
		var f frame
		if err := json.Unmarshal([]byte(data), &f); err != nil {
			r.Err = fmt.Sprintf("a frame that is not JSON: %.100s", data)
			return r
		}
		if f.Error != nil {
			r.Err = f.Error.Message
			return r
		}
		now := time.Now()
		if n := len(f.OutputIDs); n > tokens {
			if tokens == 0 {
				r.TTFT = now.Sub(start)
			} else {
				r.ITL = append(r.ITL, now.Sub(last))
			}
			tokens, last = n, now
		}
		if len(f.Meta.FinishReason) > 0 && string(f.Meta.FinishReason) != "null" {
			finished = true
			r.PromptTokens, r.OutputTokens, r.CachedTokens = f.Meta.PromptTokens, f.Meta.CompletionTokens, f.Meta.CachedTokens
		}
	}
	if err := sc.Err(); err != nil {
		r.Err = err.Error()
		return r
	}
	if !finished {
		r.Err = "the stream ended without a finished frame"
		return r
	}
	r.E2E = time.Since(start)
	r.OK = true
	return r
}

// percentiles are mean, p50, p90 and p99 (linear between ranks, as numpy)
// of ds in milliseconds.
func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	ms := make([]float64, len(ds))
	sum := 0.0
	for i, d := range ds {
		ms[i] = float64(d) / 1e6
		sum += ms[i]
	}
	slices.Sort(ms)
	at := func(q float64) float64 {
		x := q * float64(len(ms)-1)
		i := int(x)
		if i+1 >= len(ms) {
			return ms[len(ms)-1]
		}
		return ms[i] + (x-float64(i))*(ms[i+1]-ms[i])
	}
	return Percentiles{Mean: sum / float64(len(ms)), P50: at(0.5), P90: at(0.9), P99: at(0.99)}
}

func report(results []Result, dur time.Duration) Report {
	rep := Report{Requests: len(results), Duration: dur.Seconds()}
	var ttft, tpot, itl, e2e []time.Duration
	for _, r := range results {
		if !r.OK {
			rep.Failed++
			if len(rep.Errors) < 5 {
				rep.Errors = append(rep.Errors, r.Err)
			}
			continue
		}
		rep.Completed++
		rep.InputTokens += r.PromptTokens
		rep.OutputTokens += r.OutputTokens
		rep.CachedTokens += r.CachedTokens
		ttft = append(ttft, r.TTFT)
		e2e = append(e2e, r.E2E)
		itl = append(itl, r.ITL...)
		if r.OutputTokens > 1 {
			tpot = append(tpot, (r.E2E-r.TTFT)/time.Duration(r.OutputTokens-1))
		}
	}
	if s := rep.Duration; s > 0 {
		rep.RequestThroughput = float64(rep.Completed) / s
		rep.InputThroughput = float64(rep.InputTokens) / s
		rep.OutputThroughput = float64(rep.OutputTokens) / s
		rep.TotalThroughput = float64(rep.InputTokens+rep.OutputTokens) / s
	}
	if rep.InputTokens > 0 {
		rep.HitRate = float64(rep.CachedTokens) / float64(rep.InputTokens)
	}
	rep.TTFT, rep.TPOT, rep.ITL, rep.E2E = percentiles(ttft), percentiles(tpot), percentiles(itl), percentiles(e2e)
	return rep
}

// Write prints rep as a table.
func (rep Report) Write(w io.Writer) {
	fmt.Fprintf(w, "requests: %d completed, %d failed, in %.2f s\n", rep.Completed, rep.Failed, rep.Duration)
	fmt.Fprintf(w, "throughput: %.2f req/s, %.1f input tok/s, %.1f output tok/s, %.1f total tok/s\n",
		rep.RequestThroughput, rep.InputThroughput, rep.OutputThroughput, rep.TotalThroughput)
	fmt.Fprintf(w, "tokens: %d input (%d cached: hit rate %.1f %%), %d output\n", rep.InputTokens, rep.CachedTokens, 100*rep.HitRate, rep.OutputTokens)
	fmt.Fprintf(w, "%-5s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99")
	for _, row := range []struct {
		name string
		p    Percentiles
	}{{"TTFT", rep.TTFT}, {"TPOT", rep.TPOT}, {"ITL", rep.ITL}, {"E2E", rep.E2E}} {
		fmt.Fprintf(w, "%-5s %10.2f %10.2f %10.2f %10.2f\n", row.name, row.p.Mean, row.p.P50, row.p.P90, row.p.P99)
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
}
