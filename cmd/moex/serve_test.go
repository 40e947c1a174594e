package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServe: moex serve --preset tiny on a free loopback port answers
// /generate and /health, and stops cleanly when its context ends (as on
// SIGTERM); bad flags are usage errors.
func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- serveUntil(ctx, []string{"--preset", "tiny", "--port", "0", "--kv-blocks", "64"}, pw, io.Discard)
		pw.Close()
	}()
	lines := bufio.NewScanner(pr)
	require.True(t, lines.Scan())
	first := lines.Text()
	_, url, ok := strings.Cut(first, " on ")
	require.True(t, ok, first)
	url = strings.Fields(url)[0]
	go func() {
		for lines.Scan() { // the rest, so that the server never blocks writing
		}
	}()

	resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(`{"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": true}}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Contains(t, string(b), `"completion_tokens":4`)
	resp, err = http.Get(url + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	cancel()
	require.NoError(t, <-done)
	http.DefaultClient.CloseIdleConnections()

	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "give --preset tiny or --model DIR"},
		{[]string{"--preset", "huge"}, `unknown --preset "huge"`},
		{[]string{"--preset", "tiny", "--kv-blocks", "0"}, "must be positive"},
		{[]string{"--preset", "tiny", "--port", "70000"}, "--port 70000 must be in [0, 65535]"},
		{[]string{"--preset", "tiny", "--model", "x"}, "give --preset or --model, not both"},
	} {
		err := serveUntil(context.Background(), tt.args, io.Discard, io.Discard)
		require.ErrorIs(t, err, errUsage)
		require.ErrorContains(t, err, tt.want)
	}
}
