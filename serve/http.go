package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/moex-project/moex/internal/httpjson"
	"github.com/moex-project/moex/model"
)

// Tokenizer turns text into token ids and back. Byte is the random
// presets': one token a byte.
type Tokenizer interface {
	Encode(text string) ([]int32, error)
	Decode(ids []int32) string
}

// Byte is the byte-level tokenizer of the random presets: ids 0…255 are the
// bytes, 256… the specials (BOS 256, EOS 257, PAD 258, UNK 259), which
// decode to nothing.
type Byte struct{}

// EOS is Byte's end-of-sequence id.
const EOS = 257

// Encode is text's bytes.
func (Byte) Encode(text string) ([]int32, error) {
	ids := make([]int32, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int32(text[i])
	}
	return ids, nil
}

// IDsOnly is the tokenizer of a checkpoint whose tokenizer moex does not
// read: requests give input_ids, and outputs come as output_ids only.
type IDsOnly struct{}

// Encode refuses text.
func (IDsOnly) Encode(string) ([]int32, error) {
	return nil, errors.New("this server reads no tokenizer for its checkpoint: give input_ids, not text")
}

// Decode is empty: the text of ids is unknown.
func (IDsOnly) Decode([]int32) string { return "" }

// Decode is the bytes of ids below 256 as text: a byte that is not part of
// valid UTF-8 becomes U+FFFD, as JSON would make it.
func (Byte) Decode(ids []int32) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			b = append(b, byte(id))
		}
	}
	var out strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		out.WriteRune(r) // RuneError for an invalid byte, n = 1
		b = b[n:]
	}
	return out.String()
}

// Info is what /get_model_info and /get_server_info report.
type Info struct {
	ModelPath string `json:"model_path"`
	DPSize    int    `json:"dp_size"`
	MaxTokens int    `json:"max_total_num_tokens"`
	// KVBytesPerToken is what a token's cache rows take over every layer
	// (MLA: its latent; grouped-query attention: its keys and values), in
	// KVDType.
	KVBytesPerToken int64  `json:"kv_bytes_per_token,omitempty"`
	KVDType         string `json:"kv_cache_dtype,omitempty"`
	// ContextLength is the positions the model was made for (0: not
	// stated): a request whose prompt and new tokens pass it is refused
	// (ErrTooLarge), and one that does not say how many tokens to
	// generate gets at most what is left of it.
	ContextLength int `json:"context_length,omitempty"`
	// StreamInterval: a stream sends a frame every this many tokens (and
	// the last); 0 or 1: every token (SGLang's --stream-interval).
	StreamInterval int `json:"stream_interval"`
}

// Server is the worker's HTTP API over a scheduler: SGLang's /generate
// (text or input_ids; stream as server-sent events), OpenAI's
// /v1/completions and /v1/chat/completions, /health, /health_generate,
// /get_load, /get_model_info, /get_server_info, /flush_cache, /metrics.
type Server struct {
	s        Engine
	tok      Tokenizer
	stopIDs  []int32
	info     Info
	nextID   atomic.Int64
	draining atomic.Bool
	metrics  *metrics
}

// NewServer serves s (a Scheduler, or a Group of DP ranks); stopIDs end a
// request unless it sets ignore_eos.
func NewServer(s Engine, tok Tokenizer, stopIDs []int32, info Info) *Server {
	info.MaxTokens = s.Capacity()
	info.DPSize = s.Ranks()
	info.StreamInterval = max(info.StreamInterval, 1)
	return &Server{s: s, tok: tok, stopIDs: stopIDs, info: info, metrics: newMetrics(s)}
}

// Drain makes /health answer 503 (the process is stopping).
func (h *Server) Drain() { h.draining.Store(true) }

// Handler is the API's routes.
func (h *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /generate", h.generate)
	mux.HandleFunc("POST /v1/completions", h.completions)
	mux.HandleFunc("POST /v1/chat/completions", h.chatCompletions)
	mux.HandleFunc("POST /tokenize", h.tokenize)
	mux.HandleFunc("POST /detokenize", h.detokenize)
	mux.HandleFunc("GET /health_generate", h.healthGenerate)
	mux.Handle("GET /metrics", h.metrics.handler())
	mux.HandleFunc("GET /health", h.health)
	mux.HandleFunc("POST /flush_cache", func(w http.ResponseWriter, r *http.Request) {
		if err := h.s.FlushCache(); err != nil {
			httpjson.Error(w, http.StatusBadRequest, err.Error())
			return
		}
		httpjson.Write(w, http.StatusOK, map[string]any{"message": "the prefix cache is empty"})
	})
	mux.HandleFunc("GET /get_load", func(w http.ResponseWriter, r *http.Request) {
		running, waiting := h.s.Load()
		st := h.s.Stats()
		free, total := h.s.Blocks()
		httpjson.Write(w, http.StatusOK, map[string]any{"num_running_reqs": running, "num_waiting_reqs": waiting,
			"free_blocks": free, "total_blocks": total, "prefix_cache_blocks": st.CachedBlocks, "cache_hit_rate": st.HitRate(),
			"dp": h.s.RankLoads()})
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
			map[string]any{"id": h.info.ModelPath, "object": "model", "owned_by": "moex", "max_model_len": h.info.MaxTokens}}})
	})
	mux.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusOK, map[string]any{"model_path": h.info.ModelPath, "is_generation": true})
	})
	mux.HandleFunc("GET /get_server_info", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusOK, h.info)
	})
	return mux
}

// HealthTimeout bounds /health_generate's one-token generation.
const HealthTimeout = 20 * time.Second

// healthGenerate answers 200 once a one-token generation (of token 0)
// completes, 503 while draining or if it does not within HealthTimeout.
func (h *Server) healthGenerate(w http.ResponseWriter, r *http.Request) {
	if h.draining.Load() {
		httpjson.Error(w, http.StatusServiceUnavailable, "the server is draining")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), HealthTimeout)
	defer cancel()
	events, err := h.s.Submit(ctx, Request{IDs: []int32{0}, MaxNewTokens: 1, IgnoreEOS: true, Sampling: model.Sampling{TopP: 1}})
	if err != nil {
		httpjson.Error(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	for e := range events {
		if e.Done && e.Err != nil {
			httpjson.Error(w, http.StatusServiceUnavailable, "a one-token generation failed: "+e.Err.Error())
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func (h *Server) health(w http.ResponseWriter, r *http.Request) {
	if h.draining.Load() {
		httpjson.Error(w, http.StatusServiceUnavailable, "the server is draining")
		return
	}
	w.WriteHeader(http.StatusOK)
}

// samplingParams is SGLang's sampling_params, the fields moex reads.
type samplingParams struct {
	MaxNewTokens *int            `json:"max_new_tokens"`
	Temperature  *float64        `json:"temperature"`
	TopP         *float64        `json:"top_p"`
	TopK         *int            `json:"top_k"`
	IgnoreEOS    bool            `json:"ignore_eos"`
	Stop         json.RawMessage `json:"stop"`
	StopTokenIDs []int32         `json:"stop_token_ids"`
	Seed         *uint64         `json:"sampling_seed"`
}

type generateRequest struct {
	Text     *string        `json:"text"`
	InputIDs []int32        `json:"input_ids"`
	Sampling samplingParams `json:"sampling_params"`
	Stream   bool           `json:"stream"`
	RID      string         `json:"rid"`
}

// DefaultMaxNewTokens is max_new_tokens when a request does not say (SGLang's).
const DefaultMaxNewTokens = 128

// decodeStrict reads a JSON body of at most 64 MiB into v, refusing fields
// v does not have.
func decodeStrict(r *http.Request, v any, what string) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the body is not a %s request: %v", what, err)
	}
	return nil
}

// stopStrings reads a stop field: a string or a list of them (null: none).
func stopStrings(raw json.RawMessage, field string) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		raw, _ = json.Marshal([]string{one})
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%s must be a string or a list of strings", field)
	}
	for i, s := range list {
		if s == "" {
			return nil, fmt.Errorf("%s[%d] is empty", field, i)
		}
	}
	return list, nil
}

// sampling makes the scheduler's request of ids and the parameters given
// (nil: the default).
func (h *Server) sampling(ids []int32, maxNew *int, temperature, topP *float64, topK *int, seed *uint64, ignoreEOS bool, stopIDs []int32) Request {
	req := Request{IDs: ids, MaxNewTokens: DefaultMaxNewTokens, IgnoreEOS: ignoreEOS,
		StopIDs:  append(append([]int32(nil), h.stopIDs...), stopIDs...),
		Sampling: model.Sampling{Temperature: 1, TopP: 1}}
	if maxNew != nil {
		req.MaxNewTokens = *maxNew
	} else if c := h.info.ContextLength; c > len(ids) {
		req.MaxNewTokens = min(req.MaxNewTokens, c-len(ids))
	}
	if temperature != nil {
		req.Sampling.Temperature = *temperature
	}
	if topP != nil {
		req.Sampling.TopP = *topP
	}
	if topK != nil {
		req.Sampling.TopK = *topK
		if *topK == -1 { // SGLang's "no limit"
			req.Sampling.TopK = 0
		}
	}
	if seed != nil {
		req.Sampling.Seed = *seed
	} else {
		req.Sampling.Seed = uint64(h.nextID.Load())
	}
	return req
}

func (h *Server) parse(r *http.Request) (generateRequest, Request, []string, error) {
	var g generateRequest
	if err := decodeStrict(r, &g, "/generate"); err != nil {
		return g, Request{}, nil, err
	}
	var ids []int32
	switch {
	case g.Text != nil && g.InputIDs != nil:
		return g, Request{}, nil, errors.New("give text or input_ids, not both")
	case g.Text != nil:
		var err error
		if ids, err = h.encode(*g.Text, true); err != nil {
			return g, Request{}, nil, err
		}
	case g.InputIDs != nil:
		ids = g.InputIDs
	default:
		return g, Request{}, nil, errors.New("text or input_ids is required")
	}
	sp := g.Sampling
	stops, err := stopStrings(sp.Stop, "sampling_params.stop")
	if err != nil {
		return g, Request{}, nil, err
	}
	return g, h.sampling(ids, sp.MaxNewTokens, sp.Temperature, sp.TopP, sp.TopK, sp.Seed, sp.IgnoreEOS, sp.StopTokenIDs), stops, nil
}

// completion is a request's outcome as the API reports it.
type completion struct {
	ids     []int32
	text    string // decoded; cut before a stop string
	reason  string // "length" or "stop"
	matched any    // the stop string or token id that ended it
	cached  int
	err     error // the server's: the request did not finish
}

// refuse answers a request the scheduler would not take: 400, or 503 when
// the server is stopping.
func (h *Server) refuse(w http.ResponseWriter, err error) {
	status, label := http.StatusBadRequest, "bad_request"
	if errors.Is(err, context.Canceled) || h.s.Stopped() != nil {
		status, label = http.StatusServiceUnavailable, "error"
	}
	h.metrics.requests.WithLabelValues(label).Inc()
	httpjson.Error(w, status, err.Error())
}

// bad answers a request that could not be read: 400.
func (h *Server) bad(w http.ResponseWriter, err error) {
	h.metrics.requests.WithLabelValues("bad_request").Inc()
	httpjson.Error(w, http.StatusBadRequest, err.Error())
}

// start submits req; run then follows it.
func (h *Server) start(ctx context.Context, req Request, stops []string) (*run, error) {
	if len(stops) > 0 {
		if _, ok := h.tok.(IDsOnly); ok {
			return nil, errors.New("stop strings need the checkpoint's tokenizer, which this server does not read: give stop_token_ids")
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	events, err := h.s.Submit(ctx, req)
	if err != nil {
		cancel()
		return nil, err
	}
	return &run{h: h, events: events, obs: h.metrics.observe(len(req.IDs)), cancel: cancel, stops: stops}, nil
}

// run follows a submitted request.
type run struct {
	h      *Server
	events <-chan Event
	obs    *observer
	flush  func() // a stream's: sends the frames written so far
	cancel context.CancelFunc
	stops  []string
}

// wait follows the request to its end, calling emit (if not nil) after
// each token with its ids so far and the text safe to show: text that
// cannot yet turn out to begin a stop string, and no trailing incomplete
// character. A stream's frames are flushed when no further token is
// already waiting: one write for the tokens a slow reader fell behind by,
// each still its own frame.
func (r *run) wait(emit func(ids []int32, text string)) completion {
	defer r.cancel()
	var c completion
	// A tokenizer that decodes as ids arrive keeps the text up to date in
	// constant work a token; otherwise the text is decoded whole where it
	// is needed.
	var stream TextStream
	if st, ok := r.h.tok.(interface{ NewTextStream() TextStream }); ok {
		stream = st.NewTextStream()
	}
	var settled strings.Builder
	decode := func(final bool) string {
		if stream == nil {
			return r.h.tok.Decode(c.ids)
		}
		if final {
			rest, err := stream.Flush()
			if err != nil {
				return r.h.tok.Decode(c.ids)
			}
			settled.WriteString(rest)
		}
		return settled.String()
	}
	for e := range r.events {
		r.obs.event(e)
		if e.Done {
			c.cached = e.Cached
			switch {
			case c.reason == "stop" && c.matched != nil:
				// Ended here by a stop string: its cancellation is no error.
			case e.Err != nil:
				c.err = e.Err
			default:
				c.text = decode(true)
				c.reason = e.Reason
				if e.Reason == "stop" && len(c.ids) > 0 {
					c.matched = c.ids[len(c.ids)-1]
				}
			}
			return c
		}
		if c.matched != nil {
			continue // draining after a stop string
		}
		c.ids = append(c.ids, e.Token)
		if stream != nil {
			piece, err := stream.Add(e.Token)
			if err != nil {
				stream = nil // decode whole from here on
			}
			settled.WriteString(piece)
		}
		// The text so far, where a stop string or a frame needs it (the
		// whole once at the end otherwise).
		show := emit != nil && len(c.ids)%r.h.info.StreamInterval == 0
		if len(r.stops) > 0 || show {
			c.text = decode(false)
		}
		if i, s := firstStop(c.text, r.stops); i >= 0 {
			c.text, c.reason, c.matched = c.text[:i], "stop", s
			r.cancel()
			continue
		}
		if show {
			emit(c.ids, safePrefix(c.text, r.stops))
		}
		if r.flush != nil && len(r.events) == 0 {
			r.flush()
		}
	}
	return c
}

// firstStop is where the earliest stop string starts in text, and which.
func firstStop(text string, stops []string) (int, string) {
	at, which := -1, ""
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
			at, which = i, s
		}
	}
	return at, which
}

// safePrefix is text without the longest tail that begins some stop
// string, and without a trailing U+FFFD (a character whose bytes may still
// be arriving).
func safePrefix(text string, stops []string) string {
	cut := len(text)
	for _, s := range stops {
		for k := min(len(s)-1, len(text)); k > 0; k-- {
			if strings.HasSuffix(text, s[:k]) {
				cut = min(cut, len(text)-k)
				break
			}
		}
	}
	text = text[:cut]
	return strings.TrimRight(text, "\uFFFD")
}

func (h *Server) generate(w http.ResponseWriter, r *http.Request) {
	g, req, stops, err := h.parse(r)
	if err != nil {
		h.bad(w, err)
		return
	}
	rid := g.RID
	if rid == "" {
		rid = fmt.Sprintf("%d", h.nextID.Add(1))
	}
	run, err := h.start(r.Context(), req, stops)
	if err != nil {
		h.refuse(w, err)
		return
	}
	meta := func(c *completion, n int) metaInfo {
		m := metaInfo{ID: rid, PromptTokens: len(req.IDs), CompletionTokens: n}
		if c != nil {
			m.FinishReason = &finish{Type: c.reason, Matched: c.matched}
			m.CachedTokens = &c.cached
		}
		return m
	}
	if !g.Stream {
		c := run.wait(nil)
		if c.err != nil {
			httpjson.Error(w, http.StatusServiceUnavailable, c.err.Error())
			return
		}
		httpjson.Write(w, http.StatusOK, generated{Text: c.text, OutputIDs: c.ids, Meta: meta(&c, len(c.ids))})
		return
	}
	sse := startSSE(w)
	run.flush = sse.flush
	var buf []byte
	c := run.wait(func(ids []int32, text string) {
		buf = appendFrame(buf[:0], text, ids, rid, len(req.IDs))
		sse.w.Write(buf)
	})
	if c.err != nil {
		sse.frame(map[string]any{"error": map[string]any{"message": c.err.Error()}})
	} else {
		sse.frame(generated{Text: c.text, OutputIDs: c.ids, Meta: meta(&c, len(c.ids))})
	}
	sse.done()
}

// generated is /generate's answer, and each of its streamed frames.
type generated struct {
	Text      string   `json:"text"`
	OutputIDs []int32  `json:"output_ids"`
	Meta      metaInfo `json:"meta_info"`
}

type metaInfo struct {
	ID               string  `json:"id"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	CachedTokens     *int    `json:"cached_tokens,omitempty"`
	FinishReason     *finish `json:"finish_reason,omitempty"`
}

type finish struct {
	Type    string `json:"type"`
	Matched any    `json:"matched"`
}

// sse writes server-sent events.
type sse struct {
	w       http.ResponseWriter
	flusher http.Flusher
}

func startSSE(w http.ResponseWriter) sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	return sse{w, f}
}

// frame writes v as an event; flush sends it.
func (s sse) frame(v any) {
	b, _ := json.Marshal(v)
	buf := make([]byte, 0, len(b)+8)
	buf = append(append(append(buf, "data: "...), b...), "\n\n"...)
	s.w.Write(buf)
}

func (s sse) flush() {
	if s.flusher != nil {
		s.flusher.Flush()
	}
}

// done ends the stream as SGLang and OpenAI do.
func (s sse) done() {
	fmt.Fprint(s.w, "data: [DONE]\n\n")
	s.flush()
}
