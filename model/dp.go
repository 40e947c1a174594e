package model

import (
	"context"
	"fmt"
	"runtime"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/moe"
)

// MaxDPRanks bounds a DP group's in-process ranks.
const MaxDPRanks = 64

// DP runs a model over in-process data-parallel attention ranks (SGLang's
// DP attention inside one instance): each rank attends over caches of its
// own with requests of its own, and the MoE layers' experts are sharded
// over the ranks, reached by all-to-all dispatch and combine ("alltoall",
// expert parallelism) or by all-gathering the hidden states, each rank
// computing its shard, and reduce-scattering ("gather"). Every step begins
// with the coordinator's plan: the ranks' token counts, an IDLE batch for a
// rank with nothing to run (it still joins every collective), a skipped
// step when no rank has anything. Every rank must call Forward each step,
// from goroutines of its own.
type DP struct {
	m      *Model
	mode   string
	comms  []ep.Comm
	coords []*dpattn.Coordinator
	eps    [][]*ep.Layer  // [rank][layer] alltoall (nil: dense)
	shards [][]*moe.Layer // [rank][layer] gather (nil: dense)
}

// NewDP makes a group of ranks over m's weights (shared, read-only) with
// its MoE layers in mode "alltoall" or "gather"; each rank's kernels use
// GOMAXPROCS / ranks workers.
func (m *Model) NewDP(ranks int, mode string) (*DP, error) {
	if ranks < 1 || ranks > MaxDPRanks {
		return nil, fmt.Errorf("model: %d data-parallel ranks (want 1 to %d)", ranks, MaxDPRanks)
	}
	if mode != "alltoall" && mode != "gather" {
		return nil, fmt.Errorf("model: MoE mode %q (want alltoall or gather)", mode)
	}
	comms, err := ep.NewLocal(ranks)
	if err != nil {
		return nil, err
	}
	d := &DP{m: m, mode: mode, comms: comms, coords: make([]*dpattn.Coordinator, ranks),
		eps: make([][]*ep.Layer, ranks), shards: make([][]*moe.Layer, ranks)}
	workers := max(1, runtime.GOMAXPROCS(0)/ranks)
	for r, comm := range comms {
		d.coords[r] = dpattn.NewCoordinator(comm)
		d.eps[r] = make([]*ep.Layer, len(m.layers))
		d.shards[r] = make([]*moe.Layer, len(m.layers))
		for l, layer := range m.layers {
			if layer.moe == nil {
				continue
			}
			place, err := ep.Contiguous(layer.moe.Config.NumExperts, ranks)
			if err != nil {
				return nil, err
			}
			shard := ep.Shard(layer.moe, place, r, workers)
			d.shards[r][l] = shard
			if d.eps[r][l], err = ep.FromLayer(shard, comm, place); err != nil {
				return nil, err
			}
		}
	}
	return d, nil
}

// Ranks is the group's size.
func (d *DP) Ranks() int { return len(d.comms) }

// Mode is the MoE layers' mode, "alltoall" or "gather".
func (d *DP) Mode() string { return d.mode }

// Forward is Model.Forward on rank's own caches kv, in step with the
// other ranks: a rank with no tokens (or whose call is refused by Model's
// checks: it returns that error) runs an IDLE batch; a step no rank has
// tokens for is skipped. An error after the plan (a cancelled context, a
// kernel's fault) breaks the group, which every rank's later calls report.
func (d *DP) Forward(ctx context.Context, rank int, kv *KV, seqs []int, ids []int32, rows []int) ([]float32, error) {
	if rank < 0 || rank >= len(d.comms) {
		return nil, fmt.Errorf("model: rank %d of a group of %d", rank, len(d.comms))
	}
	rows, lens, refused := d.m.check(kv, seqs, ids, rows)
	if refused != nil {
		seqs, ids, rows = nil, nil, nil
	}
	mode, seen := dpattn.Decode, map[int]bool{}
	for _, s := range seqs {
		if seen[s] {
			mode = dpattn.Extend
		}
		seen[s] = true
	}
	plan, err := d.coords[rank].Plan(ctx, len(ids), mode)
	if err != nil {
		return nil, err
	}
	if plan.Skip {
		return nil, refused
	}
	comm := d.comms[rank]
	logits, err := d.m.run(ctx, kv, seqs, ids, rows, lens, func(ctx context.Context, l int, x, y []float32) error {
		if d.mode == "alltoall" {
			return d.eps[rank][l].ForwardTokens(ctx, x, ids, y, nil, nil)
		}
		return dpattn.MoEGatherTokens(ctx, comm, d.shards[rank][l], plan, x, ids, y, nil)
	})
	if err != nil {
		comm.Abort(fmt.Errorf("model: rank %d: %w", rank, err))
		return nil, err
	}
	return logits, refused
}
