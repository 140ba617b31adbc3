package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/pinflow/pinflow/audit"
	"github.com/pinflow/pinflow/ledger"
)

// AuditBatchInput is a batch of hosts one AuditHosts activity audits.
type AuditBatchInput struct {
	Hosts  []string       `json:"hosts"`
	Grace  *time.Duration `json:"grace,omitempty"`
	DryRun bool           `json:"dry_run,omitempty"`
	// Concurrency bounds the hosts audited at once (at least 1).
	Concurrency int `json:"concurrency"`
	// Every lists every host's audit in the result; otherwise only the
	// hosts that freed a claim, found drift, started an evacuation or
	// failed are listed, and the rest are counted in Total.
	Every bool `json:"every,omitempty"`
}

// AuditBatch is what auditing a batch found.
type AuditBatch struct {
	Hosts   []audit.HostAudit `json:"hosts"`
	Total   audit.Tally       `json:"total"`
	Audited int               `json:"audited"`
}

// auditedHost is one host's audit in a batch's heartbeat: a retry of the
// batch resumes after the hosts it names.
type auditedHost struct {
	I     int             `json:"i"`
	Audit audit.HostAudit `json:"audit"`
}

// hostAuditTries bounds the tries of one host's audit in a batch; a host
// that fails them all is reported with its error and the others go on.
const hostAuditTries = 3

// AuditHosts audits a batch of hosts, at most in.Concurrency at once
// (audit.Auditor.AuditHost for each). One activity for many hosts keeps
// the audit of a fleet bound by the ledger's and the hypervisors' reads
// rather than by Temporal's dispatch of activities. It heartbeats the
// audits done so far, and a retry (a worker died) audits only the rest.
// A host's audit that fails is tried again, then reported with its error;
// only a bad grace fails the batch.
func (a *Activities) AuditHosts(ctx context.Context, in AuditBatchInput) (AuditBatch, error) {
	if in.Grace != nil && *in.Grace < 0 {
		return AuditBatch{}, BadRequest(fmt.Sprintf("grace %s: must be 0 or more", *in.Grace))
	}
	done := make([]*audit.HostAudit, len(in.Hosts))
	if activity.IsActivity(ctx) && activity.HasHeartbeatDetails(ctx) {
		var prev []auditedHost
		if activity.GetHeartbeatDetails(ctx, &prev) == nil {
			for _, p := range prev {
				if p.I >= 0 && p.I < len(done) && p.Audit.Host == in.Hosts[p.I] {
					done[p.I] = &p.Audit
				}
			}
		}
	}
	var mu sync.Mutex
	progress := func() []auditedHost {
		mu.Lock()
		defer mu.Unlock()
		var out []auditedHost
		for i, h := range done {
			if h != nil {
				out = append(out, auditedHost{I: i, Audit: *h})
			}
		}
		return out
	}
	todo := make(chan int)
	var wg sync.WaitGroup
	for range max(1, min(in.Concurrency, len(in.Hosts))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range todo {
				h := a.auditOneHost(ctx, in, in.Hosts[i])
				mu.Lock()
				done[i] = &h
				mu.Unlock()
			}
		}()
	}
	beat := time.NewTicker(a.beat())
	defer beat.Stop()
feed:
	for i := range in.Hosts {
		if done[i] != nil {
			continue
		}
		for {
			select {
			case todo <- i:
				continue feed
			case <-beat.C:
				if activity.IsActivity(ctx) {
					activity.RecordHeartbeat(ctx, progress())
				}
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(todo)
	// The last hosts may take long on a loaded machine: beat on until
	// they are done, or the attempt would time out with its work in hand.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
wait:
	for {
		select {
		case <-finished:
			break wait
		case <-beat.C:
			if activity.IsActivity(ctx) {
				activity.RecordHeartbeat(ctx, progress())
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return AuditBatch{}, err
	}
	res := AuditBatch{Hosts: []audit.HostAudit{}, Audited: len(in.Hosts)}
	for _, h := range done {
		res.Total.Add(h.Tally)
		if in.Every || len(h.Freed) > 0 || len(h.Drift) > 0 || len(h.Errors) > 0 || len(h.Evacuated) > 0 {
			res.Hosts = append(res.Hosts, *h)
		}
	}
	return res, nil
}

// auditOneHost audits one host of a batch, trying again after an error
// that may pass (Redis failing over, a hypervisor not answering); an
// error that stays is the host's result.
func (a *Activities) auditOneHost(ctx context.Context, in AuditBatchInput, host string) audit.HostAudit {
	var err error
	for try := range hostAuditTries {
		var h audit.HostAudit
		h, err = a.Audit.AuditHost(ctx, audit.AuditHostInput{Host: host, Grace: in.Grace, DryRun: in.DryRun})
		if err == nil {
			return h
		}
		var bad *audit.InvalidError
		if errors.As(err, &bad) || errors.Is(err, ledger.ErrUnknownHost) || try == hostAuditTries-1 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(1<<try) * time.Second):
		}
		if ctx.Err() != nil {
			break
		}
	}
	h := audit.HostAudit{Host: host, DryRun: in.DryRun, Errors: []string{auditErr(err).Error()}}
	h.Tally.Errors = 1
	return h
}
