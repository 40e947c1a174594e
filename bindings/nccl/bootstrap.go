// Package nccl is a thin shim over NCCL, loaded with dlopen (libnccl.so.2;
// no NCCL headers, no link-time dependency): communicators and the
// collectives moex uses on device buffers, all-to-all as grouped
// ncclSend/ncclRecv, errors carrying NCCL's own strings, and
// ErrLibraryNotFound without the library. Bootstrap gives every rank the
// communicator's unique id over TCP with torchrun's variables, BootstrapOver
// through a host group already there (MPI under mpirun); Comm.Await waits
// for enqueued work and aborts the communicator when a peer does not arrive
// by the context's deadline.
package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// UniqueIDBytes is the size of ncclUniqueId.
const UniqueIDBytes = 128

// UniqueID is an NCCL communicator's unique id.
type UniqueID [UniqueIDBytes]byte

// Env is the rendezvous configuration, with torchrun's names.
type Env struct {
	MasterAddr string // MASTER_ADDR
	MasterPort int    // MASTER_PORT
	Rank       int    // RANK
	WorldSize  int    // WORLD_SIZE
}

// EnvFromOS reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, with an
// error naming the variable that is missing or malformed.
func EnvFromOS() (Env, error) { return envFrom(os.Getenv) }

func envFrom(get func(string) string) (Env, error) {
	var e Env
	e.MasterAddr = get("MASTER_ADDR")
	if e.MasterAddr == "" {
		return e, errors.New("nccl: MASTER_ADDR is not set")
	}
	ints := []struct {
		name string
		dst  *int
	}{{"MASTER_PORT", &e.MasterPort}, {"RANK", &e.Rank}, {"WORLD_SIZE", &e.WorldSize}}
	for _, v := range ints {
		s := get(v.name)
		if s == "" {
			return e, fmt.Errorf("nccl: %s is not set", v.name)
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return e, fmt.Errorf("nccl: %s=%q is not an integer", v.name, s)
		}
		*v.dst = n
	}
	return e, e.Validate()
}

// Validate checks the ranges of the configuration.
func (e Env) Validate() error {
	switch {
	case e.MasterPort < 1 || e.MasterPort > 65535:
		return fmt.Errorf("nccl: MASTER_PORT %d is not a TCP port", e.MasterPort)
	case e.WorldSize < 1:
		return fmt.Errorf("nccl: WORLD_SIZE %d must be at least 1", e.WorldSize)
	case e.Rank < 0 || e.Rank >= e.WorldSize:
		return fmt.Errorf("nccl: RANK %d is not in [0, WORLD_SIZE %d)", e.Rank, e.WorldSize)
	}
	return nil
}

// Bootstrap gives every rank the same unique id: rank 0 makes it with
// newID (ncclGetUniqueId), listens on MASTER_ADDR:MASTER_PORT and sends it
// to each of the other ranks, which connect (retrying until rank 0
// listens) and say their rank. A rank that never connects, a duplicate
// rank or a rank 0 that never answers ends in an error by ctx's deadline.
func Bootstrap(ctx context.Context, e Env, newID func() (UniqueID, error)) (UniqueID, error) {
	if err := e.Validate(); err != nil {
		return UniqueID{}, err
	}
	addr := net.JoinHostPort(e.MasterAddr, strconv.Itoa(e.MasterPort))
	if e.Rank == 0 {
		return serve(ctx, addr, e.WorldSize, newID)
	}
	return fetch(ctx, addr, e.Rank)
}

const magic = 0x6d6f6578 // "moex"

func serve(ctx context.Context, addr string, world int, newID func() (UniqueID, error)) (UniqueID, error) {
	id, err := newID()
	if err != nil {
		return UniqueID{}, fmt.Errorf("nccl: making the unique id: %w", err)
	}
	if world == 1 {
		return id, nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return UniqueID{}, fmt.Errorf("nccl: rank 0 listening on %s: %w", addr, err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	seen := make([]bool, world)
	seen[0] = true
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	for joined := 1; joined < world; joined++ {
		conn, err := ln.Accept()
		if err != nil {
			wg.Wait()
			missing := []int{}
			for r, ok := range seen {
				if !ok {
					missing = append(missing, r)
				}
			}
			if ctx.Err() != nil {
				return UniqueID{}, fmt.Errorf("nccl: rank 0: ranks %v did not connect to %s: %w", missing, addr, ctx.Err())
			}
			return UniqueID{}, fmt.Errorf("nccl: rank 0 accepting on %s: %w", addr, err)
		}
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(time.Minute)
		}
		conn.SetDeadline(deadline)
		var hello [8]byte
		if _, err := io.ReadFull(conn, hello[:]); err != nil {
			conn.Close()
			return UniqueID{}, fmt.Errorf("nccl: rank 0: reading a peer's hello: %w", err)
		}
		if binary.LittleEndian.Uint32(hello[:4]) != magic {
			conn.Close()
			return UniqueID{}, fmt.Errorf("nccl: rank 0: a connection from %s is not a moex rank", conn.RemoteAddr())
		}
		r := int(binary.LittleEndian.Uint32(hello[4:]))
		if r <= 0 || r >= world || seen[r] {
			conn.Close()
			return UniqueID{}, fmt.Errorf("nccl: rank 0: a peer says it is rank %d (world size %d, duplicate or out of range)", r, world)
		}
		seen[r] = true
		wg.Go(func() {
			defer conn.Close()
			if _, err := conn.Write(id[:]); err != nil {
				fail(fmt.Errorf("nccl: rank 0: sending the id to rank %d: %w", r, err))
			}
		})
	}
	wg.Wait()
	return id, firstErr
}

func fetch(ctx context.Context, addr string, rank int) (UniqueID, error) {
	var d net.Dialer
	var conn net.Conn
	var err error
	for {
		conn, err = d.DialContext(ctx, "tcp", addr)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return UniqueID{}, fmt.Errorf("nccl: rank %d: rank 0 at %s never answered: %w (last: %v)", rank, addr, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	var hello [8]byte
	binary.LittleEndian.PutUint32(hello[:4], magic)
	binary.LittleEndian.PutUint32(hello[4:], uint32(rank))
	if _, err := conn.Write(hello[:]); err != nil {
		return UniqueID{}, fmt.Errorf("nccl: rank %d: saying hello to %s: %w", rank, addr, err)
	}
	var id UniqueID
	if _, err := io.ReadFull(conn, id[:]); err != nil {
		return UniqueID{}, fmt.Errorf("nccl: rank %d: reading the id from %s: %w", rank, addr, err)
	}
	return id, nil
}

// A Group is a host group the ranks already share (an ep.Comm: the MPI
// world, in-process ranks), as BootstrapOver needs it.
type Group interface {
	Rank() int
	// AllGather returns every rank's send, in rank order.
	AllGather(ctx context.Context, send []byte) ([][]byte, error)
	// Abort makes every rank's pending and later calls fail with err.
	Abort(err error)
}

// BootstrapOver gives every rank of an existing host group the same unique
// id: the launch path under mpirun, where the MPI world (ep/mpi) or any
// other ep.Comm is already there. Rank 0 makes the id with newID and one
// all-gather carries it; a rank 0 that cannot make one aborts the group, so
// the others fail too instead of waiting.
func BootstrapOver(ctx context.Context, c Group, newID func() (UniqueID, error)) (UniqueID, error) {
	var id UniqueID
	send := []byte{}
	if c.Rank() == 0 {
		var err error
		if id, err = newID(); err != nil {
			err = fmt.Errorf("nccl: rank 0 could not make the unique id: %w", err)
			c.Abort(err)
			return UniqueID{}, err
		}
		send = id[:]
	}
	parts, err := c.AllGather(ctx, send)
	if err != nil {
		return UniqueID{}, err
	}
	if len(parts[0]) != UniqueIDBytes {
		return UniqueID{}, fmt.Errorf("nccl: rank 0 sent a %d-byte unique id, want %d", len(parts[0]), UniqueIDBytes)
	}
	copy(id[:], parts[0])
	return id, nil
}
