package activities

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/ledger"
	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

// ClaimRepinInput asks for the claim of a running guest's re-pin on its
// host.
type ClaimRepinInput struct {
	UUID string `json:"uuid"`
	Host string `json:"host"`
	// Resident is the guest's resident claim, as the operation found it.
	Resident string `json:"resident"`
	ClaimID  string `json:"claim_id"`
	Owner    Owner  `json:"owner"`
	// PCPUs are the pCPUs asked for (api.RepinInput); empty packs the
	// guest onto the lowest pCPUs of its cells free or its own.
	PCPUs numa.CPUSet `json:"pcpus,omitzero"`
}

// ClaimRepin makes the re-pin claim of the guest's target placement on
// its host (ledger.ClaimRepin): the pCPUs it is to run on that it does
// not hold already. A guest not on in.Host's in.Resident claim is a
// BadState; one without pinned vCPUs, or pCPUs it cannot take, an
// InvalidRequest; pCPUs another claim holds, a Conflict.
func (a *Activities) ClaimRepin(ctx context.Context, in ClaimRepinInput) (ClaimResult, error) {
	inst, err := a.Ledger.Instance(ctx, in.UUID)
	if err != nil {
		return ClaimResult{}, classify(err)
	}
	if inst.Host != in.Host || inst.ClaimID != in.Resident {
		return ClaimResult{}, BadState(fmt.Sprintf("instance %s is on claim %s of %q, not on claim %s of %s", in.UUID, inst.ClaimID, inst.Host, in.Resident, in.Host))
	}
	snap, err := a.Ledger.Snapshot(ctx, in.Host)
	if err != nil {
		return ClaimResult{}, classify(err)
	}
	target, err := repinTarget(snap, inst.Placement, in.Resident, in.PCPUs)
	if err != nil {
		return ClaimResult{}, BadRequest(fmt.Sprintf("instance %s: %v", in.UUID, err))
	}
	c, err := a.Ledger.ClaimRepin(ctx, ledger.RepinSpec{ID: in.ClaimID, Host: in.Host, InstanceUUID: in.UUID, Resident: in.Resident,
		OwnerWorkflowID: in.Owner.WorkflowID, OwnerRunID: in.Owner.FirstRunID, Target: target})
	if err != nil {
		return ClaimResult{}, conflict(err)
	}
	return ClaimResult{Host: c.Host, ClaimID: c.ID, Token: c.Token, State: c.State, Placement: *c.Target}, nil
}

// repinTarget is placement p with its pinned vCPUs, and a reserved
// emulator pCPU, on other pCPUs of the same host cells: those of pcpus in
// each cell's host cell, in order, or, when empty, the lowest pCPUs of
// each cell that no
// claim but resident holds (whole cores of them under thread policy
// isolate). The ledger judges the rest when it claims it.
func repinTarget(snap *ledger.Snapshot, p *numa.Placement, resident string, pcpus numa.CPUSet) (*numa.Placement, error) {
	if p == nil || !slices.ContainsFunc(p.Cells, func(c numa.PlacedCell) bool { return len(c.Pins) > 0 }) {
		return nil, errors.New("it has no pinned vCPUs to re-pin (cpu policy dedicated or mixed)")
	}
	taken := map[int]bool{}
	for _, pin := range snap.Pins {
		if pin.ClaimID != resident {
			taken[pin.CPU] = true
		}
	}
	need := 0
	for _, c := range p.Cells {
		need += len(c.Pins) + c.Reserved.Len()
	}
	if pcpus.Len() > 0 && pcpus.Len() != need {
		return nil, fmt.Errorf("%s given (%s), and it pins %s: one per pinned vCPU and one for a reserved emulator thread", pcpusOf(pcpus.Len()), pcpus, pcpusOf(need))
	}
	out := *p
	out.Cells = slices.Clone(p.Cells)
	for i := range out.Cells {
		cell := &out.Cells[i]
		host := snap.Topology.Cell(cell.HostCell)
		if host == nil {
			return nil, fmt.Errorf("its guest cell %d is on host cell %d, which the host does not have", cell.GuestCell, cell.HostCell)
		}
		vcpus := slices.Sorted(maps.Keys(cell.Pins))
		n := len(vcpus) + cell.Reserved.Len()
		var picked []int
		if pcpus.Len() > 0 {
			// A guest cell takes the given pCPUs of its host cell.
			mine := pcpus.Intersection(host.PCPUs)
			if mine.Len() != n {
				return nil, fmt.Errorf("its guest cell %d pins %s of host cell %d (pinnable: %s), and %d of those given are there: a re-pin keeps each guest cell on its host cell",
					cell.GuestCell, pcpusOf(n), host.ID, host.PCPUs, mine.Len())
			}
			picked = mine.List()
		} else {
			picked = lowestFree(host, taken, n, cell.ThreadPolicy == numa.ThreadPolicyIsolate)
			if len(picked) < n {
				return nil, fmt.Errorf("host cell %d has %s free or its own, and guest cell %d pins %d", host.ID, pcpusOf(len(picked)), cell.GuestCell, n)
			}
		}
		cell.Pins = make(map[int]int, len(vcpus))
		for j, v := range vcpus {
			cell.Pins[v] = picked[j]
		}
		cell.Reserved = numa.NewCPUSet(picked[len(vcpus):]...)
	}
	return &out, nil
}

// pcpusOf is n pCPUs, in words.
func pcpusOf(n int) string {
	if n == 1 {
		return "1 pCPU"
	}
	return fmt.Sprintf("%d pCPUs", n)
}

// lowestFree returns up to n of cell's pCPUs not taken, lowest first;
// whole cores only when isolate (the siblings of a pCPU it takes go with
// it, unused).
func lowestFree(cell *numa.Cell, taken map[int]bool, n int, isolate bool) []int {
	var out []int
	for _, cpu := range cell.PCPUs.List() {
		if len(out) == n {
			break
		}
		if taken[cpu] {
			continue
		}
		if isolate {
			if sib := siblingsOf(cell, cpu); sib.Len() > 0 && (sib.List()[0] != cpu || slices.ContainsFunc(sib.List(), func(s int) bool { return taken[s] })) {
				continue
			}
		}
		out = append(out, cpu)
	}
	return out
}

func siblingsOf(cell *numa.Cell, cpu int) numa.CPUSet {
	for _, s := range cell.Siblings {
		if s.Contains(cpu) {
			return s
		}
	}
	return numa.CPUSet{}
}

// RepinDomainInput is the live re-pin of a guest to its re-pin claim's
// target.
type RepinDomainInput struct {
	UUID    string         `json:"uuid"`
	Host    string         `json:"host"`
	ClaimID string         `json:"claim_id"`
	Token   string         `json:"token"`
	Target  numa.Placement `json:"target"`
}

// RepinDomain pins the running guest's vCPUs, emulator and I/O threads to
// the target and makes its persistent definition say so, fenced on the
// re-pin claim: an attempt whose operation ended changes nothing.
// Repinning a guest that has the target's pins already succeeds.
func (a *Activities) RepinDomain(ctx context.Context, in RepinDomainInput) error {
	return a.heartbeating(ctx, func(ctx context.Context) error {
		def, err := a.repinnedXML(ctx, in.Host, in.UUID, &in.Target)
		if err != nil {
			return err
		}
		f, err := a.fenceDomain(ctx, DomainInput{UUID: in.UUID, Host: in.Host, ClaimID: in.ClaimID, Token: in.Token}, false)
		if err != nil {
			return err
		}
		return f.do(ctx, func(ctx context.Context) error { return a.Driver.Repin(ctx, in.Host, in.UUID, def) })
	})
}

// repinnedXML is the guest's definition pinned to p: the one its record
// keeps, or the hypervisor's when the record keeps none.
func (a *Activities) repinnedXML(ctx context.Context, host, uuid string, p *numa.Placement) (string, error) {
	inst, err := a.Ledger.Instance(ctx, uuid)
	if err != nil {
		return "", classify(err)
	}
	base := inst.DomainXML
	if base == "" {
		dom, err := a.Driver.Lookup(ctx, host, uuid)
		if errors.Is(err, hypervisor.ErrNotFound) {
			return "", BadState(fmt.Sprintf("instance %s has no domain on %s to re-pin", uuid, host))
		}
		if err != nil {
			return "", classify(err)
		}
		base = dom.XML
	}
	xml, err := xmlpatch.Patch(base, p)
	return xml, classify(err)
}

// CommitRepinInput names a re-pin to commit.
type CommitRepinInput struct {
	UUID     string `json:"uuid"`
	Host     string `json:"host"`
	Resident string `json:"resident"`
	ClaimID  string `json:"claim_id"`
}

// CommitRepin makes the re-pin's target the guest's resident claim's
// (ledger.CommitRepin) and points the record at it with the re-pinned
// definition. Both are retried safely.
func (a *Activities) CommitRepin(ctx context.Context, in CommitRepinInput) error {
	c, err := a.Ledger.CommitRepin(ctx, in.Host, in.Resident, in.ClaimID)
	if err != nil {
		return classify(err)
	}
	xml, err := a.repinnedXML(ctx, in.Host, in.UUID, c.Placement)
	if err != nil {
		return err
	}
	return classify(a.Ledger.AttachInstance(ctx, in.UUID, in.Host, in.Resident, xml))
}
