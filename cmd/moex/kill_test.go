package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/router"
)

// TestHelperServe is not a test: run by TestWorkerKilled as a child
// process (MOEX_HELPER_SERVE set to the port), it is a moex serve worker
// until killed.
func TestHelperServe(t *testing.T) {
	port := os.Getenv("MOEX_HELPER_SERVE")
	if port == "" {
		t.Skip("a helper process")
	}
	serveUntil(context.Background(), []string{"--preset", "tiny", "--port", port, "--kv-blocks", "256"}, io.Discard, io.Discard)
	os.Exit(0)
}

// freePort is a loopback port nothing listens on now.
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// startWorker runs a moex serve worker as a child process on port.
func startWorker(t *testing.T, port string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServe$")
	cmd.Env = append(os.Environ(), "MOEX_HELPER_SERVE="+port)
	require.NoError(t, cmd.Start())
	return cmd
}

// TestWorkerKilled: two worker processes behind the router; one is killed
// with SIGKILL while requests run. No request is lost (a request whose
// response had not started goes to the other worker), the dead worker is
// taken out after the health threshold, and comes back when a new process
// listens on its port.
func TestWorkerKilled(t *testing.T) {
	ports := []string{freePort(t), freePort(t)}
	procs := []*exec.Cmd{startWorker(t, ports[0]), startWorker(t, ports[1])}
	defer func() {
		for _, p := range procs {
			p.Process.Kill()
			p.Wait()
		}
	}()
	cfg := router.Defaults()
	cfg.Policy = "round_robin"
	cfg.HealthInterval, cfg.HealthTimeout, cfg.StartupTimeout = 50*time.Millisecond, time.Second, 20*time.Second
	cfg.BackoffInitial, cfg.BackoffMax = time.Millisecond, 10*time.Millisecond
	r, err := router.New(cfg)
	require.NoError(t, err)
	for _, p := range ports {
		require.NoError(t, r.AddWorker(context.Background(), "http://127.0.0.1:"+p))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { r.Run(ctx) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: r.Handler()}
	go srv.Serve(ln)
	defer func() {
		srv.Close()
		cancel()
		loops.Wait()
		http.DefaultClient.CloseIdleConnections()
	}()
	url := "http://" + ln.Addr().String()

	var ok, lost atomic.Int64
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(
				fmt.Sprintf(`{"text": "request %d", "sampling_params": {"max_new_tokens": 24, "ignore_eos": true}}`, i)))
			if err != nil {
				lost.Add(1)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"completion_tokens":24`) {
				ok.Add(1)
			} else {
				lost.Add(1)
				t.Logf("request %d: %d %s", i, resp.StatusCode, b)
			}
		})
		if i == 15 {
			time.Sleep(20 * time.Millisecond) // requests are running on both
			require.NoError(t, procs[0].Process.Signal(syscall.SIGKILL))
		}
	}
	wg.Wait()
	procs[0].Wait()
	require.Zero(t, lost.Load(), "no request lost")
	require.Equal(t, int64(40), ok.Load())
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Regexp(t, `moex_router_retries_total [1-9]`, string(m), "requests met the dead worker and went to the other")
	dead := r.Workers()[0]
	require.Eventually(t, func() bool { return !dead.Healthy() }, 10*time.Second, 10*time.Millisecond)
	require.Zero(t, dead.Load())

	procs[0] = startWorker(t, ports[0])
	require.Eventually(t, func() bool { return dead.Healthy() }, 20*time.Second, 20*time.Millisecond, "re-admitted")
	for i := range 4 {
		resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(fmt.Sprintf(`{"text": "again %d", "sampling_params": {"max_new_tokens": 2}}`, i)))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
}
