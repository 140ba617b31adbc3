package ledger

import (
	"strconv"

	"github.com/pinflow/pinflow/internal/jsonenc"
)

// appendJSON appends c's record as encoding/json writes a Claim, by hand:
// every claim writes one, and reflection cost more than the claim's fit.
func (c *Claim) appendJSON(b []byte) []byte {
	b = append(b, `{"state":`...)
	b = jsonenc.AppendString(b, string(c.State))
	if c.CommittedAt != nil {
		b = append(b, `,"committed_at":`...)
		b = jsonenc.AppendTime(b, *c.CommittedAt)
	}
	for _, f := range [...]struct{ name, value string }{
		{"id", c.ID}, {"host", c.Host}, {"instance_uuid", c.InstanceUUID}, {"kind", string(c.Kind)},
		{"owner_workflow_id", c.OwnerWorkflowID}, {"owner_run_id", c.OwnerRunID}, {"token", c.Token},
	} {
		b = append(b, `,"`...)
		b = append(b, f.name...)
		b = append(b, `":`...)
		b = jsonenc.AppendString(b, f.value)
	}
	b = append(b, `,"created_at":`...)
	b = jsonenc.AppendTime(b, c.CreatedAt)
	b = append(b, `,"generation":`...)
	b = strconv.AppendInt(b, c.Generation, 10)
	b = append(b, `,"placement":`...)
	if c.Placement == nil {
		b = append(b, "null"...)
	} else {
		b = c.Placement.AppendJSON(b)
	}
	b = append(b, `,"usage":`...)
	if c.Usage == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, u := range c.Usage {
			if i > 0 {
				b = append(b, ',')
			}
			b = u.AppendJSON(b)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}
