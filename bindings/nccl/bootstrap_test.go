package nccl

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/ep"
)

func testID() UniqueID {
	var id UniqueID
	for i := range id {
		id[i] = byte(i*7 + 3)
	}
	return id
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestMain lets the test binary act as one rank of a multi-process
// bootstrap when MOEX_BOOTSTRAP_CHILD is set.
func TestMain(m *testing.M) {
	if os.Getenv("MOEX_BOOTSTRAP_CHILD") == "1" {
		env, err := EnvFromOS()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(3)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		id, err := Bootstrap(ctx, env, func() (UniqueID, error) { return testID(), nil })
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(4)
		}
		fmt.Println("id", hex.EncodeToString(id[:]))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestBootstrapProcesses: four processes on loopback, rank 0 last to
// start, all get rank 0's id intact.
func TestBootstrapProcesses(t *testing.T) {
	port := freePort(t)
	const world = 4
	outs := make([]string, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for _, r := range []int{3, 1, 2, 0} {
		if r == 0 {
			time.Sleep(200 * time.Millisecond) // the others retry until rank 0 listens
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "MOEX_BOOTSTRAP_CHILD=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(world))
		wg.Go(func() {
			out, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(out), err
		})
	}
	wg.Wait()
	want := "id " + hex.EncodeToString(func() []byte { id := testID(); return id[:] }())
	for r := 0; r < world; r++ {
		require.NoError(t, errs[r], "rank %d: %s", r, outs[r])
		require.Equal(t, want, strings.TrimSpace(outs[r]), "rank %d", r)
	}
}

func TestEnvErrors(t *testing.T) {
	base := map[string]string{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "4"}
	tests := []struct {
		name, key, value, err string
	}{
		{"no address", "MASTER_ADDR", "", "MASTER_ADDR is not set"},
		{"no port", "MASTER_PORT", "", "MASTER_PORT is not set"},
		{"bad port", "MASTER_PORT", "http", `MASTER_PORT="http" is not an integer`},
		{"port out of range", "MASTER_PORT", "70000", "MASTER_PORT 70000 is not a TCP port"},
		{"no rank", "RANK", "", "RANK is not set"},
		{"rank too large", "RANK", "4", "RANK 4 is not in [0, WORLD_SIZE 4)"},
		{"no world", "WORLD_SIZE", "", "WORLD_SIZE is not set"},
		{"zero world", "WORLD_SIZE", "0", "WORLD_SIZE 0 must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := envFrom(func(k string) string {
				if k == tt.key {
					return tt.value
				}
				return base[k]
			})
			require.ErrorContains(t, err, tt.err)
		})
	}
	e, err := envFrom(func(k string) string { return base[k] })
	require.NoError(t, err)
	require.Equal(t, Env{"127.0.0.1", 29500, 1, 4}, e)
}

// TestRankNeverConnects: rank 0 reports the missing rank at the deadline,
// and a rank whose rank 0 never listens gives up at its deadline.
func TestRankNeverConnects(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	var err0, err1 error
	var id1 UniqueID
	wg.Go(func() {
		_, err0 = Bootstrap(ctx, Env{"127.0.0.1", port, 0, 3}, func() (UniqueID, error) { return testID(), nil })
	})
	wg.Go(func() { id1, err1 = Bootstrap(ctx, Env{"127.0.0.1", port, 1, 3}, nil) })
	wg.Wait()
	require.ErrorContains(t, err0, "ranks [2] did not connect")
	require.NoError(t, err1)
	require.Equal(t, testID(), id1)

	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err := Bootstrap(ctx2, Env{"127.0.0.1", freePort(t), 2, 3}, nil)
	require.ErrorContains(t, err, "rank 2: rank 0 at 127.0.0.1")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestBootstrapOver: under mpirun the id travels over the host group that
// is already there; a rank 0 that cannot make one fails every rank.
func TestBootstrapOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids := make([]UniqueID, 4)
	errs, err := ep.RunLocal(4, func(c ep.Comm) error {
		var err error
		ids[c.Rank()], err = BootstrapOver(ctx, c, func() (UniqueID, error) { return testID(), nil })
		return err
	})
	require.NoError(t, err)
	for r := range ids {
		require.NoError(t, errs[r])
		require.Equal(t, testID(), ids[r], "rank %d", r)
	}

	errs, err = ep.RunLocal(3, func(c ep.Comm) error {
		_, err := BootstrapOver(ctx, c, func() (UniqueID, error) { return UniqueID{}, ErrLibraryNotFound })
		return err
	})
	require.NoError(t, err)
	require.ErrorIs(t, errs[0], ErrLibraryNotFound)
	require.ErrorContains(t, errs[0], "rank 0 could not make the unique id")
	for r := 1; r < 3; r++ {
		require.ErrorIs(t, errs[r], ep.ErrAborted, "rank %d", r)
	}
}
