package client

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/google/uuid"

	"github.com/pinflow/pinflow/ledger"
)

// maxListed bounds how many candidates a refusal names: a fleet's worth
// would make a line nobody reads.
const maxListed = 5

// Instance finds the guest ref names: its UUID, a prefix of its UUID
// that no other guest's has, or a name no other guest has.
func (c *Client) Instance(ctx context.Context, ref string) (*ledger.Instance, error) {
	if ref == "" {
		return nil, fmt.Errorf("a guest is named by its UUID, a unique UUID prefix or a unique name; got an empty name: %w", ErrInvalid)
	}
	if id, err := uuid.Parse(ref); err == nil && len(ref) == 36 {
		inst, err := c.led.Instance(ctx, id.String())
		if errors.Is(err, ledger.ErrUnknownInstance) {
			return nil, fmt.Errorf("unknown instance %q: no guest has that UUID: %w", ref, ErrUnknownGuest)
		}
		return inst, err
	}
	all, err := c.led.Instances(ctx)
	if err != nil {
		return nil, err
	}
	var byName, byPrefix []*ledger.Instance
	for _, in := range all {
		if in.Name == ref {
			byName = append(byName, in)
		}
		if strings.HasPrefix(in.UUID, strings.ToLower(ref)) {
			byPrefix = append(byPrefix, in)
		}
	}
	// A unique name is an exact match, which wins over prefixes.
	switch {
	case len(byName) == 1:
		return byName[0], nil
	case len(byName) > 1:
		return nil, fmt.Errorf("instance %q is ambiguous: %s have that name; give the UUID: %w", ref, candidates(byName), ErrInvalid)
	case len(byPrefix) == 1:
		return byPrefix[0], nil
	case len(byPrefix) > 1:
		return nil, fmt.Errorf("instance %q is ambiguous: the UUIDs of %s start with it; give more of the UUID: %w", ref, candidates(byPrefix), ErrInvalid)
	}
	return nil, fmt.Errorf("unknown instance %q: no guest has that UUID, UUID prefix or name: %w", ref, ErrUnknownGuest)
}

// candidates lists the guests a name matches, a few of them by UUID.
func candidates(insts []*ledger.Instance) string {
	var ids []string
	for _, in := range insts {
		ids = append(ids, in.UUID+" ("+in.Name+")")
	}
	sort.Strings(ids)
	if len(ids) > maxListed {
		return fmt.Sprintf("%d guests, among them %s", len(ids), strings.Join(ids[:maxListed], ", "))
	}
	return strings.Join(ids, " and ")
}

// Instances lists every guest the ledger records, in no order.
func (c *Client) Instances(ctx context.Context) ([]*ledger.Instance, error) {
	return c.led.Instances(ctx)
}
