package workflows

import (
	"fmt"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pinflow/pinflow/api"
)

// phase records a new phase in the status, the search attributes and the
// UI's current details.
func (s *saga) phase(p api.Phase, detail string) {
	s.status.Phase, s.status.Detail = p, detail
	if p == api.PhaseCompleted {
		s.status.Progress = 100
	}
	// Upserting can only fail on a bad key, which the constants rule out.
	_ = workflow.UpsertTypedSearchAttributes(s.ctx, api.AttrPhase.ValueSet(string(p)))
	workflow.SetCurrentDetails(s.ctx, s.details())
}

func (s *saga) setHosts(src, dst string) {
	var attrs []temporal.SearchAttributeUpdate
	if src != "" && src != s.status.Source {
		s.status.Source = src
		attrs = append(attrs, api.AttrSourceHost.ValueSet(src))
	}
	if dst != "" && dst != s.status.Dest {
		s.status.Dest = dst
		attrs = append(attrs, api.AttrDestHost.ValueSet(dst))
	}
	if len(attrs) > 0 {
		_ = workflow.UpsertTypedSearchAttributes(s.ctx, attrs...)
	}
}

// details renders the status as the markdown the Web UI shows.
func (s *saga) details() string {
	st := s.status
	md := fmt.Sprintf("**%s**: phase **%s** (%d%%)", st.Operation, st.Phase, st.Progress)
	if st.Instance != "" {
		md = fmt.Sprintf("**%s** of `%s`: phase **%s** (%d%%)", st.Operation, st.Instance, st.Phase, st.Progress)
	}
	switch {
	case st.Source != "" && st.Dest != "":
		md += fmt.Sprintf("\n\nsource `%s` → destination `%s`", st.Source, st.Dest)
	case st.Source != "":
		md += fmt.Sprintf("\n\nhost `%s`", st.Source)
	case st.Dest != "":
		md += fmt.Sprintf("\n\nhost `%s`", st.Dest)
	}
	if s.about != "" {
		md += "\n\n" + s.about
	}
	if st.Detail != "" {
		md += "\n\n" + st.Detail
	}
	if st.Error != "" {
		md += "\n\nerror: " + st.Error
	}
	return md + uiFrameSlack
}

// uiFrameSlack ends the details with a blank line. The Web UI sizes the
// frame it renders them in to the body's scrollHeight, which leaves out
// the first paragraph's top margin: the last 14 pixels or so are cut,
// half of a drain's last table row, unless a blank line takes the cut.
const uiFrameSlack = "\n\n\u00a0"

// step counts a finished step towards Progress.
func (s *saga) step() {
	s.done++
	if s.steps > 0 {
		s.status.Progress = min(99, s.done*100/s.steps)
	}
}
