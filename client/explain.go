package client

import (
	"context"
	"fmt"

	"github.com/pinflow/pinflow/guest"
	"github.com/pinflow/pinflow/placement"
)

// ExplainRequest asks which hosts would take a guest, changing nothing:
// a new guest of Flavor (a boot); the existing guest Guest names, as a
// migration or an unshelve asks (its flavor, its own host excluded); or,
// with Guest and Flavor both given, that guest resized, as Resize merges
// Flavor into its flavor (its own host a candidate, which must hold both
// placements at once).
type ExplainRequest struct {
	Flavor guest.Flavor
	Guest  string
	// Host, when set, asks about that host alone; a disabled host is a
	// candidate then, as it is for an operation that names it.
	Host string
}

// Explain says, for every host, whether it takes the guest and why not,
// grouped, and which host pinflow would choose now. It reads every host,
// so it costs as much as the fleet is large; it is for operators.
func (c *Client) Explain(ctx context.Context, r ExplainRequest) (*placement.Explanation, error) {
	flavor, name := r.Flavor, "the new guest"
	var exclude []string
	var group *placement.ServerGroup
	if r.Guest != "" {
		inst, err := c.Instance(ctx, r.Guest)
		if err != nil {
			return nil, err
		}
		name = inst.UUID
		if group, err = placement.MemberGroup(ctx, c.led, inst.UUID); err != nil {
			return nil, err
		}
		resize := ResizeRequest{VCPUs: r.Flavor.VCPUs, MemoryMB: r.Flavor.MemoryMB, ExtraSpecs: r.Flavor.ExtraSpecs, ImageProps: r.Flavor.ImageProps}
		if flavor = resize.flavorOf(inst); !changes(r.Flavor) && inst.Host != "" {
			exclude = []string{inst.Host}
		}
	}
	if len(r.Flavor.ExtraSpecs) > 0 {
		var err error
		if flavor, err = c.resolveAliases(flavor); err != nil {
			return nil, fmt.Errorf("explain %s: %w", name, err)
		}
	}
	req, err := flavor.Request()
	if err != nil {
		return nil, fmt.Errorf("explain %s: %w", name, invalid(err))
	}
	if r.Host != "" {
		if _, err := c.HostStatus(ctx, r.Host); err != nil {
			return nil, err
		}
	}
	return placement.Explain(ctx, c.led, placement.Request{UUID: name, Request: req, Exclude: exclude}, r.Host, group)
}

// changes says whether f changes anything of a flavor it is merged into.
func changes(f guest.Flavor) bool {
	return f.VCPUs != 0 || f.MemoryMB != 0 || len(f.ExtraSpecs) > 0 || len(f.ImageProps) > 0
}
