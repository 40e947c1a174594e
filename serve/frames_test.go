package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pacedEngine is an Engine that gives every running request a token each
// gap from one goroutine, as the scheduler's step does, n tokens a request,
// computing nothing: what is left of a stream's cost is the server's.
type pacedEngine struct {
	n    int
	mu   sync.Mutex
	runs []*pacedRun
	stop chan struct{}
	wg   sync.WaitGroup
}

type pacedRun struct {
	ch   chan Event
	sent int
}

func newPacedEngine(n int, gap time.Duration) *pacedEngine {
	e := &pacedEngine{n: n, stop: make(chan struct{})}
	e.wg.Go(func() {
		t := time.NewTicker(gap)
		defer t.Stop()
		for {
			select {
			case <-e.stop:
				return
			case <-t.C:
			}
			e.mu.Lock()
			left := e.runs[:0]
			for _, r := range e.runs {
				r.ch <- Event{Token: int32('a' + r.sent%26)}
				if r.sent++; r.sent == e.n {
					r.ch <- Event{Done: true, Reason: "length"}
					close(r.ch)
					continue
				}
				left = append(left, r)
			}
			e.runs = left
			e.mu.Unlock()
		}
	})
	return e
}

func (e *pacedEngine) close() { close(e.stop); e.wg.Wait() }

func (e *pacedEngine) Submit(ctx context.Context, r Request) (<-chan Event, error) {
	run := &pacedRun{ch: make(chan Event, e.n+1)}
	e.mu.Lock()
	e.runs = append(e.runs, run)
	e.mu.Unlock()
	return run.ch, nil
}
func (*pacedEngine) Load() (int, int)      { return 0, 0 }
func (*pacedEngine) RankLoads() []RankLoad { return nil }
func (*pacedEngine) Stats() Stats          { return Stats{} }
func (*pacedEngine) FlushCache() error     { return nil }
func (*pacedEngine) Capacity() int         { return 1 << 20 }
func (*pacedEngine) Blocks() (int, int)    { return 0, 0 }
func (*pacedEngine) Stopped() error        { return nil }
func (*pacedEngine) Ranks() int            { return 1 }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// streamClients runs streams concurrent streamed requests against url and
// checks each got its tokens.
func streamClients(url string, streams, tokens int) error {
	errs := make([]error, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			resp, err := http.Post(url+"/generate", "application/json",
				strings.NewReader(fmt.Sprintf(`{"input_ids": [1, 2, 3], "stream": true, "sampling_params": {"max_new_tokens": %d}}`, tokens)))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			frames := 0
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") {
					frames++
				}
			}
			if frames != tokens+2 { // each token, the final frame, [DONE]
				errs[i] = fmt.Errorf("%d frames, want %d", frames, tokens+2)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TestStreamClientChild is BenchmarkStreamFrames' client process: it runs
// only when the benchmark starts it, and prints the CPU it used.
func TestStreamClientChild(t *testing.T) {
	url := os.Getenv("MOEX_STREAM_CLIENT_URL")
	if url == "" {
		t.Skip("the client process of BenchmarkStreamFrames")
	}
	n, err := strconv.Atoi(os.Getenv("MOEX_STREAM_CLIENT_ROUNDS"))
	require.NoError(t, err)
	start := cpuTime()
	for range n {
		require.NoError(t, streamClients(url, 16, 64))
	}
	fmt.Printf("client-cpu-ns %d\n", cpuTime()-start)
}

// BenchmarkStreamFrames: the CPU a streamed token costs the server, and
// its clients, apart: sixteen streams of 64 tokens, a token every 100 µs
// each, from an engine that computes nothing, the clients in a process of
// their own over loopback. Beside it, in the same run, the time of one
// write of a frame's size to a loopback TCP connection: the kernel's part,
// which no server can avoid at one frame a token.
//
//	go test ./serve -run '^$' -bench StreamFrames -benchtime 50x [-cpuprofile cpu.out]
func BenchmarkStreamFrames(b *testing.B) {
	const streams, tokens = 16, 64
	e := newPacedEngine(tokens, 100*time.Microsecond)
	defer e.close()
	srv := httptest.NewServer(NewServer(e, Byte{}, nil, Info{}).Handler())
	defer srv.Close()
	exe, err := os.Executable()
	require.NoError(b, err)
	b.ResetTimer()
	start := cpuTime()
	cmd := exec.Command(exe, "-test.run", "^TestStreamClientChild$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "MOEX_STREAM_CLIENT_URL="+srv.URL, "MOEX_STREAM_CLIENT_ROUNDS="+strconv.Itoa(b.N))
	out, err := cmd.CombinedOutput()
	require.NoError(b, err, "%s", out)
	server := cpuTime() - start
	b.StopTimer()
	var client int64
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "client-cpu-ns "); ok {
			client, err = strconv.ParseInt(v, 10, 64)
			require.NoError(b, err)
		}
	}
	require.NotZero(b, client, "the client printed no CPU time: %s", out)
	n := float64(b.N * streams * tokens)
	b.ReportMetric(float64(server.Nanoseconds())/1e3/n, "server-cpu-µs/token")
	b.ReportMetric(float64(client)/1e3/n, "client-cpu-µs/token")
	b.ReportMetric(loopbackWrite(b, 200).Seconds()*1e6, "loopback-write-µs")
}

// loopbackWrite is the time of one size-byte write to a loopback TCP
// connection whose other end a goroutine drains.
func loopbackWrite(b *testing.B, size int) time.Duration {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(io.Discard, c)
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(b, err)
	defer c.Close()
	buf := make([]byte, size)
	const writes = 20000
	start := time.Now()
	for range writes {
		_, err := c.Write(buf)
		require.NoError(b, err)
	}
	return time.Since(start) / writes
}
