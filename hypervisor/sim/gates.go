package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/hypervisor"
)

// Gate names a point of the simulated operations where a test can hold
// the next calls until it releases them: it reaches an exact window of an
// operation (a cancel while a guest starts, an audit between a migration's
// switchover and its end) by construction, with no latency to guess.
type Gate string

// The gates: one before each operation with a latency (after its host is
// checked, before its latency and fault), and two inside a live migration.
const (
	GateDefine   Gate = "define"
	GateStart    Gate = "start"
	GateShutdown Gate = "shutdown"
	GateStop     Gate = "stop"
	GateUndefine Gate = "undefine"
	GatePrepare  Gate = "prepare"
	GateMigrate  Gate = "migrate"
	// GateCopy holds a migration that has begun (the destination holds
	// the incoming domain) before its copy starts, as QEMU holds a copy
	// it has not started yet: a cancel there aborts it.
	GateCopy Gate = "copy"
	// GateSwitchover holds a migration whose copy is done, before its
	// point of no return: a cancel there aborts it.
	GateSwitchover Gate = "switchover"
	// GateSwitched holds a migration past its point of no return, the
	// guest's home already the destination: a cancel there is noted and
	// does not stop it, as a real migration past its switchover completes.
	GateSwitched Gate = "switched"
	GateDetach   Gate = "detach"
	GateAttach   Gate = "attach"
	GateRepin    Gate = "repin"
)

// Gates lists every Gate in the order an operation meets them.
func Gates() []Gate {
	return []Gate{GateDefine, GateStart, GateShutdown, GateStop, GateUndefine, GateDetach, GatePrepare, GateMigrate, GateCopy, GateSwitchover, GateSwitched, GateAttach, GateRepin}
}

// ParseGate reads a gate name, case-insensitively.
func ParseGate(s string) (Gate, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	names := make([]string, 0, len(Gates()))
	for _, g := range Gates() {
		if string(g) == name {
			return g, nil
		}
		names = append(names, string(g))
	}
	return "", fmt.Errorf("sim: gate %q: must be one of %s", s, strings.Join(names, ", "))
}

// GateState is what a gate has seen since it was last held.
type GateState struct {
	Gate Gate `json:"gate"`
	// Guest is the domain UUID the gate holds; empty, every domain.
	Guest string `json:"guest,omitempty"`
	Held  bool   `json:"held"`
	// Arrived counts the calls that reached the gate while it was held.
	Arrived int `json:"arrived"`
	// Cancelled counts the held calls whose context was cancelled there.
	Cancelled int `json:"cancelled"`
}

// gatePoll is how often a held call looks whether its gate was released.
const gatePoll = 20 * time.Millisecond

// gateKey is g's key for the domain uuid, or for every domain ("").
func (d *Driver) gateKey(g Gate, uuid string) string {
	if uuid == "" {
		return d.prefix + ":gate:" + string(g)
	}
	return d.prefix + ":gate:" + string(g) + ":" + uuid
}

// HoldGate makes the next calls that reach g wait until ReleaseGate, and
// starts its counts afresh: the calls on domain uuid, or on every domain
// when uuid is "". A call held by both waits for both to be released.
func (d *Driver) HoldGate(ctx context.Context, g Gate, uuid string) error {
	pipe := d.rdb.TxPipeline()
	pipe.Del(ctx, d.gateKey(g, uuid))
	pipe.HSet(ctx, d.gateKey(g, uuid), "held", "1", "arrived", "0", "cancelled", "0")
	_, err := pipe.Exec(ctx)
	return err
}

// ReleaseGate lets the calls held at g (for uuid, or every domain) go on,
// and the next ones pass; its counts stay readable.
func (d *Driver) ReleaseGate(ctx context.Context, g Gate, uuid string) error {
	return d.rdb.HSet(ctx, d.gateKey(g, uuid), "held", "0").Err()
}

// ClearGate releases g for uuid and forgets its counts.
func (d *Driver) ClearGate(ctx context.Context, g Gate, uuid string) error {
	return d.rdb.Del(ctx, d.gateKey(g, uuid)).Err()
}

// GateState reads g's state for uuid (or every domain).
func (d *Driver) GateState(ctx context.Context, g Gate, uuid string) (GateState, error) {
	st := GateState{Gate: g, Guest: uuid}
	v, err := d.rdb.HGetAll(ctx, d.gateKey(g, uuid)).Result()
	if err != nil {
		return st, err
	}
	st.Held = v["held"] == "1"
	st.Arrived, _ = strconv.Atoi(v["arrived"])
	st.Cancelled, _ = strconv.Atoi(v["cancelled"])
	return st, nil
}

// AwaitGate waits until cond holds of g's state for uuid, or ctx ends.
func (d *Driver) AwaitGate(ctx context.Context, g Gate, uuid string, cond func(GateState) bool) (GateState, error) {
	for {
		st, err := d.GateState(ctx, g, uuid)
		if err != nil || cond(st) {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("sim: gate %s: %w (arrived %d, cancelled %d)", g, ctx.Err(), st.Arrived, st.Cancelled)
		case <-time.After(gatePoll):
		}
	}
}

// gate holds a call on domain uuid at g while g is held for it or for
// every domain. A cancelled call returns its context's error, unless the
// call is past its point of no return (unstoppable): that one notes the
// cancel and waits for the release.
func (d *Driver) gate(ctx context.Context, g Gate, uuid string, unstoppable bool) error {
	// The call's own context may end while it waits; the gate's counts
	// must still be written.
	bg := context.WithoutCancel(ctx)
	keys, err := d.heldGates(bg, g, uuid)
	if err != nil || len(keys) == 0 {
		return err
	}
	for _, k := range keys {
		if err := d.rdb.HIncrBy(bg, k, "arrived", 1).Err(); err != nil {
			return err
		}
	}
	noted := false
	for {
		if hypervisor.Expired(ctx) != nil && !noted {
			noted = true
			for _, k := range keys {
				if err := d.rdb.HIncrBy(bg, k, "cancelled", 1).Err(); err != nil {
					return err
				}
			}
			if !unstoppable {
				return hypervisor.Expired(ctx)
			}
		}
		if keys, err = d.heldGates(bg, g, uuid); err != nil || len(keys) == 0 {
			if err == nil && !unstoppable {
				// Released: the call goes on only within its deadline.
				err = hypervisor.Expired(ctx)
			}
			return err
		}
		time.Sleep(gatePoll)
	}
}

// heldGates returns the keys of g that hold a call on uuid.
func (d *Driver) heldGates(ctx context.Context, g Gate, uuid string) ([]string, error) {
	pipe := d.rdb.Pipeline()
	all := pipe.HGet(ctx, d.gateKey(g, ""), "held")
	own := pipe.HGet(ctx, d.gateKey(g, uuid), "held")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var keys []string
	if all.Val() == "1" {
		keys = append(keys, d.gateKey(g, ""))
	}
	if own.Val() == "1" {
		keys = append(keys, d.gateKey(g, uuid))
	}
	return keys, nil
}
