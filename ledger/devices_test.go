package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pinflow/pinflow/numa"
)

// sriovHost is testHost(2, 8) with PCI devices: on cell 0 a PF with four
// VFs, on cell 1 a PF with two, and a GPU with no NUMA node.
func sriovHost() *numa.Host {
	h := testHost(2, 8)
	node := func(n int) *int { return &n }
	phys := map[string]string{"physical_network": "physnet1"}
	pf := func(addr string, n int) numa.PCIDevice {
		return numa.PCIDevice{Address: addr, VendorID: "8086", ProductID: "1572", DevType: numa.DeviceTypePF, NUMANode: node(n), Tags: phys}
	}
	vf := func(addr, parent string, n int) numa.PCIDevice {
		return numa.PCIDevice{Address: addr, VendorID: "8086", ProductID: "154c", DevType: numa.DeviceTypeVF, PhysFunction: parent, NUMANode: node(n), Tags: phys}
	}
	h.PCIDevices = []numa.PCIDevice{
		pf("0000:81:00.0", 0),
		vf("0000:81:02.0", "0000:81:00.0", 0), vf("0000:81:02.1", "0000:81:00.0", 0),
		vf("0000:81:02.2", "0000:81:00.0", 0), vf("0000:81:02.3", "0000:81:00.0", 0),
		pf("0000:82:00.0", 1),
		vf("0000:82:02.0", "0000:82:00.0", 1), vf("0000:82:02.1", "0000:82:00.0", 1),
		{Address: "0000:3b:00.0", VendorID: "10de", ProductID: "1eb8", DevType: numa.DeviceTypePCI},
	}
	return h
}

// withDevices is dedicated(t, vcpus, 512) asking for count devices of
// vendor:product under the required policy; a product of 1572 asks for
// PFs.
func withDevices(t testing.TB, vcpus int, product string, count int) *numa.Request {
	t.Helper()
	r := dedicated(t, vcpus, 512, "hw:pci_numa_affinity_policy", "required")
	s := numa.DeviceSpec{"vendor_id": "8086", "product_id": product}
	if product == "1572" {
		s["dev_type"] = "type-PF"
	}
	if err := r.AddDevices([]numa.PCIRequest{{Count: count, Specs: []numa.DeviceSpec{s}}}, nil, map[string]string{"hw:cpu_policy": "dedicated"}, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

func heldBy(s *Snapshot) map[string]string {
	out := map[string]string{}
	for _, d := range s.Devices {
		out[d.Address] = d.ClaimID
	}
	return out
}

func TestClaimHoldsDevices(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "h1", sriovHost())

	vfs, err := l.Claim(ctx, spec("vfs", "h1", withDevices(t, 2, "154c", 3)))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:81:02.0", "0000:81:02.1", "0000:81:02.2"}; !slices.Equal(vfs.Devices, want) || vfs.Placement.Cells[0].HostCell != 0 {
		t.Fatalf("VF claim holds %v on h%d, want %v on h0 (%s)", vfs.Devices, vfs.Placement.Cells[0].HostCell, want, vfs.Placement)
	}
	// Cell 0's PF has VFs in use: the PF comes from cell 1 and holds its VFs.
	pf, err := l.Claim(ctx, spec("pf", "h1", withDevices(t, 2, "1572", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:82:00.0", "0000:82:02.0", "0000:82:02.1"}; !slices.Equal(pf.Devices, want) {
		t.Fatalf("PF claim holds %v, want %v", pf.Devices, want)
	}
	s := snapshot(t, l, "h1")
	if got := heldBy(s); len(got) != 6 || got["0000:81:02.2"] != "vfs" || got["0000:82:02.1"] != "pf" {
		t.Fatalf("held devices %v", got)
	}
	if n := len(s.Topology.Devices); n != 2 {
		t.Errorf("free pools %v, want the last VF of cell 0 and the GPU", s.Topology.Devices)
	}

	// Only one VF is left: two do not fit, and no second PF is free.
	var nofit *numa.NoFitError
	if _, err := l.Claim(ctx, spec("two", "h1", withDevices(t, 2, "154c", 2))); !errors.As(err, &nofit) {
		t.Fatalf("two VFs with one free: %v, want no fit", err)
	}
	if _, err := l.Claim(ctx, spec("pf2", "h1", withDevices(t, 2, "1572", 1))); !errors.As(err, &nofit) {
		t.Fatalf("a second PF: %v, want no fit", err)
	}
	// An explicit placement on a held device is refused, and changes nothing.
	again := spec("again", "h1", nil)
	again.Placement = pf.Placement
	if _, err := l.Claim(ctx, again); !errors.Is(err, ErrConflict) {
		t.Fatalf("claim of the PF's placement again: %v, want ErrConflict", err)
	}
	// A topology that drops a held device, or adds a VF under the PF
	// passed through, is refused.
	dropped := sriovHost()
	dropped.PCIDevices = dropped.PCIDevices[:len(dropped.PCIDevices)-2]
	if _, err := l.RegisterHost(ctx, "h1", dropped); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "0000:82:02.1") {
		t.Errorf("registering without a held VF: %v, want ErrConflict naming it", err)
	}
	added := sriovHost()
	added.PCIDevices = append(added.PCIDevices, numa.PCIDevice{Address: "0000:82:02.2", VendorID: "8086", ProductID: "154c",
		DevType: numa.DeviceTypeVF, PhysFunction: "0000:82:00.0", NUMANode: added.PCIDevices[5].NUMANode})
	if _, err := l.RegisterHost(ctx, "h1", added); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "holds PCI devices") {
		t.Errorf("registering a VF under a held PF: %v, want ErrConflict", err)
	}
	pooled := sriovHost()
	pooled.PCIDevices = nil
	pooled.Devices = []numa.DevicePool{{VendorID: "8086", ProductID: "154c", DevType: numa.DeviceTypeVF, Count: 4}}
	if _, err := l.RegisterHost(ctx, "h2", pooled); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "pci_pools") {
		t.Errorf("registering pools: %v, want ErrInvalid naming pci_pools", err)
	}

	// Released, the PF frees its VFs with it; the VFs claim takes them.
	if err := l.Release(ctx, "h1", "pf"); err != nil {
		t.Fatal(err)
	}
	more, err := l.Claim(ctx, spec("more", "h1", withDevices(t, 2, "154c", 2)))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:82:02.0", "0000:82:02.1"}; !slices.Equal(more.Devices, want) {
		t.Errorf("after the PF's release a claim of two VFs holds %v, want %v", more.Devices, want)
	}
	for _, id := range []string{"vfs", "more"} {
		if err := l.Release(ctx, "h1", id); err != nil {
			t.Fatal(err)
		}
	}
	if s := snapshot(t, l, "h1"); len(s.Devices) != 0 || len(s.Claims) != 0 {
		t.Errorf("after every release: devices %v, claims %v", s.Devices, s.Claims)
	}
	if n, err := rdb.Exists(ctx, l.hostKeys("h1").pins).Result(); err != nil || n != 0 {
		t.Errorf("pins key left: %d, %v", n, err)
	}
}

// Claims of two processes race for the VFs and PFs of one host while a
// sampler checks every snapshot: no device is ever held twice, and a PF
// and one of its VFs never are at once.
func TestConcurrentClaimsKeepOneOwnerPerDevice(t *testing.T) {
	ctx := context.Background()
	l, _, srv := newLedger(t)
	rdb2 := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
	t.Cleanup(func() { _ = rdb2.Close() })
	l2, err := New(rdb2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := sriovHost()
	register(t, l, "h1", h)
	requests := []*numa.Request{
		withDevices(t, 1, "154c", 1),
		withDevices(t, 1, "154c", 2),
		withDevices(t, 1, "1572", 1),
	}
	parent := map[string]string{}
	for _, d := range h.PCIDevices {
		parent[d.Address] = d.PhysFunction
	}
	wantClaims := int64(100)
	if testing.Short() {
		wantClaims = 20
	}
	var claimed, pfs, busy atomic.Int64
	enough := func() bool { return claimed.Load() >= wantClaims && pfs.Load() > 0 && busy.Load() > 0 }
	stop := make(chan struct{})
	var workers sync.WaitGroup
	for w := range 16 {
		lw := []*Ledger{l, l2}[w%2]
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := 0; !enough(); i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := requests[(w+i)%len(requests)]
				s := spec(fmt.Sprintf("w%d-%d", w, i), "h1", r)
				c, err := lw.Claim(ctx, s)
				var nf *numa.NoFitError
				switch {
				case errors.As(err, &nf), errors.Is(err, ErrConflict):
					continue
				case err != nil:
					t.Errorf("Claim(%s): %v", s.ID, err)
					return
				}
				claimed.Add(1)
				if r == requests[2] {
					pfs.Add(1)
				}
				if want := r.PCI[0].Count; len(c.Placement.Devices) != 1 || len(c.Placement.Devices[0].Addresses) != want {
					t.Errorf("claim %s takes %+v, want %d devices", c.ID, c.Placement.Devices, want)
				}
				if err := lw.Release(ctx, "h1", s.ID); err != nil {
					t.Errorf("Release(%s): %v", s.ID, err)
					return
				}
			}
		}()
	}
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := l.Snapshot(ctx, "h1")
			if err != nil {
				t.Errorf("Snapshot: %v", err)
				return
			}
			if err := s.Verify(); err != nil {
				t.Errorf("snapshot with %d claims: %v", len(s.Claims), err)
				return
			}
			held := heldBy(s)
			for a, owner := range held {
				if p := parent[a]; p != "" && held[p] != "" && held[p] != owner {
					t.Errorf("VF %s is held by %s while its PF %s is held by %s", a, owner, p, held[p])
				}
			}
			if len(s.Claims) > 1 {
				busy.Add(1)
			}
		}
	}()
	hang := time.AfterFunc(2*time.Minute, func() { close(stop) })
	workers.Wait()
	if hang.Stop() {
		close(stop)
	}
	sampler.Wait()
	if !enough() {
		t.Errorf("%d claims, %d of PFs, %d busy snapshots: the race was not exercised", claimed.Load(), pfs.Load(), busy.Load())
	}
	if s := snapshot(t, l, "h1"); len(s.Devices) != 0 || len(s.Claims) != 0 {
		t.Errorf("after every release: devices %v, claims %v", s.Devices, s.Claims)
	}
}

func TestVerifyFindsDeviceCorruption(t *testing.T) {
	ctx := context.Background()
	l, rdb, _ := newLedger(t)
	register(t, l, "h1", sriovHost())
	c1, err := l.Claim(ctx, spec("c1", "h1", withDevices(t, 1, "154c", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, spec("c2", "h1", withDevices(t, 1, "154c", 1))); err != nil {
		t.Fatal(err)
	}
	k := l.hostKeys("h1")
	dev := c1.Devices[0]
	for _, tc := range []struct {
		name   string
		break_ func(p redis.Pipeliner)
		want   string
	}{
		{"device held by the wrong claim", func(p redis.Pipeliner) { p.HSet(ctx, k.pins, dev, "c2") }, "is held by c2 but claim c1 holds it"},
		{"device held by no claim", func(p redis.Pipeliner) { p.HSet(ctx, k.pins, "0000:3b:00.0", "ghost") }, "0000:3b:00.0 is held by ghost"},
		{"claimed device not held", func(p redis.Pipeliner) { p.HDel(ctx, k.pins, dev) }, "which is not pinned"},
		{"record without the device", func(p redis.Pipeliner) {
			c := *c1
			c.Devices = nil
			rec, _ := jsonClaim(&c)
			p.HSet(ctx, k.claims, "c1", rec)
		}, "holds PCI devices [], its placement"},
		{"undo entry frees another device", func(p redis.Pipeliner) {
			e, _ := rdb.HGet(ctx, k.undo, "c1").Result()
			p.HSet(ctx, k.undo, "c1", strings.Replace(e, dev, "0000:81:02.3", 1))
		}, "undo entry frees PCI devices [0000:81:02.3]"},
	} {
		saved := map[string][]byte{}
		for _, key := range []string{k.pins, k.claims, k.undo} {
			d, err := rdb.Dump(ctx, key).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			saved[key] = d
		}
		if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { tc.break_(p); return nil }); err != nil {
			t.Fatal(err)
		}
		s, err := l.Snapshot(ctx, "h1")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Verify(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Verify with %s: %v, want an error containing %q", tc.name, err, tc.want)
		}
		for key, d := range saved {
			if err := rdb.RestoreReplace(ctx, key, 0, string(d)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		snapshot(t, l, "h1")
	}
}
