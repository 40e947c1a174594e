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
	"unicode/utf8"

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
}

// Server is the worker's HTTP API over a scheduler: SGLang's /generate
// (text or input_ids; stream as server-sent events), /health, /get_load,
// /get_model_info, /get_server_info.
type Server struct {
	s        *Scheduler
	tok      Tokenizer
	stopIDs  []int32
	info     Info
	nextID   atomic.Int64
	draining atomic.Bool
	metrics  *metrics
}

// NewServer serves s; stopIDs end a request unless it sets ignore_eos.
func NewServer(s *Scheduler, tok Tokenizer, stopIDs []int32, info Info) *Server {
	info.MaxTokens = s.capacity()
	return &Server{s: s, tok: tok, stopIDs: stopIDs, info: info, metrics: newMetrics(s)}
}

// Drain makes /health answer 503 (the process is stopping).
func (h *Server) Drain() { h.draining.Store(true) }

// Handler is the API's routes.
func (h *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /generate", h.generate)
	mux.Handle("GET /metrics", h.metrics.handler())
	mux.HandleFunc("GET /health", h.health)
	mux.HandleFunc("POST /flush_cache", func(w http.ResponseWriter, r *http.Request) {
		if err := h.s.FlushCache(); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"message": "the prefix cache is empty"})
	})
	mux.HandleFunc("GET /get_load", func(w http.ResponseWriter, r *http.Request) {
		running, waiting := h.s.Load()
		st := h.s.Stats()
		writeJSON(w, http.StatusOK, map[string]any{"num_running_reqs": running, "num_waiting_reqs": waiting,
			"free_blocks": h.s.kv.FreeBlocks(), "total_blocks": h.s.kv.NumBlocks(),
			"prefix_cache_blocks": st.CachedBlocks, "cache_hit_rate": st.HitRate()})
	})
	mux.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"model_path": h.info.ModelPath, "is_generation": true})
	})
	mux.HandleFunc("GET /get_server_info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, h.info)
	})
	return mux
}

func (h *Server) health(w http.ResponseWriter, r *http.Request) {
	if h.draining.Load() {
		writeError(w, http.StatusServiceUnavailable, "the server is draining")
		return
	}
	w.WriteHeader(http.StatusOK)
}

// samplingParams is SGLang's sampling_params, the fields moex reads.
type samplingParams struct {
	MaxNewTokens *int     `json:"max_new_tokens"`
	Temperature  *float64 `json:"temperature"`
	TopP         *float64 `json:"top_p"`
	TopK         *int     `json:"top_k"`
	IgnoreEOS    bool     `json:"ignore_eos"`
	StopTokenIDs []int32  `json:"stop_token_ids"`
	Seed         *uint64  `json:"sampling_seed"`
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

func (h *Server) parse(r *http.Request) (generateRequest, Request, error) {
	var g generateRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return g, Request{}, fmt.Errorf("the body is not a /generate request: %v", err)
	}
	var ids []int32
	switch {
	case g.Text != nil && g.InputIDs != nil:
		return g, Request{}, errors.New("give text or input_ids, not both")
	case g.Text != nil:
		var err error
		if ids, err = h.tok.Encode(*g.Text); err != nil {
			return g, Request{}, err
		}
	case g.InputIDs != nil:
		ids = g.InputIDs
	default:
		return g, Request{}, errors.New("text or input_ids is required")
	}
	sp := g.Sampling
	req := Request{IDs: ids, MaxNewTokens: DefaultMaxNewTokens, IgnoreEOS: sp.IgnoreEOS,
		StopIDs:  append(append([]int32(nil), h.stopIDs...), sp.StopTokenIDs...),
		Sampling: model.Sampling{Temperature: 1, TopP: 1}}
	if sp.MaxNewTokens != nil {
		req.MaxNewTokens = *sp.MaxNewTokens
	}
	if sp.Temperature != nil {
		req.Sampling.Temperature = *sp.Temperature
	}
	if sp.TopP != nil {
		req.Sampling.TopP = *sp.TopP
	}
	if sp.TopK != nil {
		req.Sampling.TopK = *sp.TopK
		if *sp.TopK == -1 { // SGLang's "no limit"
			req.Sampling.TopK = 0
		}
	}
	if sp.Seed != nil {
		req.Sampling.Seed = *sp.Seed
	} else {
		req.Sampling.Seed = uint64(h.nextID.Load())
	}
	return g, req, nil
}

func (h *Server) generate(w http.ResponseWriter, r *http.Request) {
	g, req, err := h.parse(r)
	if err != nil {
		h.metrics.requests.WithLabelValues("bad_request").Inc()
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rid := g.RID
	if rid == "" {
		rid = fmt.Sprintf("%d", h.nextID.Add(1))
	}
	events, err := h.s.Submit(r.Context(), req)
	if err != nil {
		status, label := http.StatusBadRequest, "bad_request"
		if errors.Is(err, context.Canceled) || h.s.stoppedErr() != nil {
			status, label = http.StatusServiceUnavailable, "error"
		}
		h.metrics.requests.WithLabelValues(label).Inc()
		writeError(w, status, err.Error())
		return
	}
	events = h.metrics.observe(len(req.IDs), events)
	var out []int32
	meta := func(e Event) map[string]any {
		m := map[string]any{"id": rid, "prompt_tokens": len(req.IDs), "completion_tokens": len(out)}
		if e.Done {
			m["finish_reason"] = map[string]any{"type": e.Reason}
			m["cached_tokens"] = e.Cached
		}
		return m
	}
	if !g.Stream {
		for e := range events {
			if e.Done {
				if e.Err != nil {
					writeError(w, http.StatusServiceUnavailable, e.Err.Error())
					return
				}
				writeJSON(w, http.StatusOK, map[string]any{"text": h.tok.Decode(out), "output_ids": out, "meta_info": meta(e)})
				return
			}
			out = append(out, e.Token)
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	frame := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	for e := range events {
		if e.Done {
			if e.Err != nil {
				frame(map[string]any{"error": map[string]any{"message": e.Err.Error()}})
			} else {
				frame(map[string]any{"text": h.tok.Decode(out), "output_ids": out, "meta_info": meta(e)})
			}
			break
		}
		out = append(out, e.Token)
		frame(map[string]any{"text": h.tok.Decode(out), "output_ids": out, "meta_info": meta(e)})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "code": status}})
}
