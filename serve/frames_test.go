package serve

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pacedEngine is an Engine that streams n tokens a request, one every
// gap, computing nothing: what is left of a stream's cost is the server's
// (and, in one process, its clients').
type pacedEngine struct {
	n   int
	gap time.Duration
}

func (f pacedEngine) Submit(ctx context.Context, r Request) (<-chan Event, error) {
	ch := make(chan Event, f.n+1)
	go func() {
		defer close(ch)
		for i := range f.n {
			ch <- Event{Token: int32('a' + i%26)}
			time.Sleep(f.gap)
		}
		ch <- Event{Done: true, Reason: "length"}
	}()
	return ch, nil
}
func (pacedEngine) Load() (int, int)      { return 0, 0 }
func (pacedEngine) RankLoads() []RankLoad { return nil }
func (pacedEngine) Stats() Stats          { return Stats{} }
func (pacedEngine) FlushCache() error     { return nil }
func (pacedEngine) Capacity() int         { return 1 << 20 }
func (pacedEngine) Blocks() (int, int)    { return 0, 0 }
func (pacedEngine) Stopped() error        { return nil }
func (pacedEngine) Ranks() int            { return 1 }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStreamFrames: the CPU a streamed token costs, server and
// clients together (one process, loopback): sixteen streams of 64 tokens,
// a token every 100 µs each, from an engine that computes nothing.
//
//	go test ./serve -run '^$' -bench StreamFrames -benchtime 50x [-cpuprofile cpu.out]
func BenchmarkStreamFrames(b *testing.B) {
	const streams, tokens = 16, 64
	srv := httptest.NewServer(NewServer(pacedEngine{n: tokens, gap: 100 * time.Microsecond}, Byte{}, nil, Info{}).Handler())
	defer srv.Close()
	var cpu time.Duration
	for b.Loop() {
		start := cpuTime()
		var wg sync.WaitGroup
		for range streams {
			wg.Go(func() {
				resp, err := http.Post(srv.URL+"/generate", "application/json",
					strings.NewReader(`{"input_ids": [1, 2, 3], "stream": true, "sampling_params": {"max_new_tokens": 64}}`))
				require.NoError(b, err)
				sc := bufio.NewScanner(resp.Body)
				frames := 0
				for sc.Scan() {
					if strings.HasPrefix(sc.Text(), "data: ") {
						frames++
					}
				}
				resp.Body.Close()
				require.Equal(b, tokens+2, frames) // each token, the final frame, [DONE]
			})
		}
		wg.Wait()
		cpu += cpuTime() - start
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*streams*tokens), "cpu-µs/token")
	http.DefaultClient.CloseIdleConnections()
}
