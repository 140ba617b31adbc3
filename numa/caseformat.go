package numa

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// HostSpec is a host in the JSON form of the Nova reference cases in
// testdata/nova: cells with their CPUs, sibling groups, memory, page pools
// and usage, plus the host's cpu_dedicated_set / cpu_shared_set. It is also
// how an operator describes a host to pinflow.
type HostSpec struct {
	Cells           []CellSpec `json:"cells"`
	CPUDedicatedSet string     `json:"cpu_dedicated_set,omitempty"`
	CPUSharedSet    string     `json:"cpu_shared_set,omitempty"`
	// SiblingsOrder is accepted for compatibility; pinflow keeps sibling
	// groups in the order given.
	SiblingsOrder string `json:"siblings_order,omitempty"`
	PackCells     bool   `json:"packing_host_numa_cells_allocation_strategy,omitempty"`
}

// CellSpec is one host cell of a HostSpec. CPUSet and PCPUSet, when absent,
// are derived from CPUs and the host's cpu_*_set as Nova's libvirt driver
// does.
type CellSpec struct {
	ID            int        `json:"id"`
	CPUs          []int      `json:"cpus,omitempty"`
	CPUSet        *[]int     `json:"cpuset,omitempty"`
	PCPUSet       *[]int     `json:"pcpuset,omitempty"`
	Siblings      [][]int    `json:"siblings,omitempty"`
	MemoryMB      int64      `json:"memory_mb"`
	MemoryUsageMB int64      `json:"memory_usage_mb,omitempty"`
	CPUUsage      int        `json:"cpu_usage,omitempty"`
	PinnedCPUs    []int      `json:"pinned_cpus,omitempty"`
	MemPages      []PagePool `json:"mempages,omitempty"`
	Socket        *int       `json:"socket,omitempty"`
}

func idSet(field string, ids []int) (CPUSet, error) {
	var b cpuSetBuilder
	for _, id := range ids {
		if id < 0 || id > MaxCPU {
			return CPUSet{}, fmt.Errorf("%s: cpu id %d out of range 0-%d", field, id, MaxCPU)
		}
		b.add(id)
	}
	return b.set(), nil
}

// Host converts the spec into a validated Host with the given limits (nil:
// none).
func (s *HostSpec) Host(limits *Limits) (*Host, error) {
	if len(s.Cells) == 0 {
		return nil, fmt.Errorf("numa: host: cells is empty; at least one cell is required")
	}
	var dedicated, shared CPUSet
	var err error
	if s.CPUDedicatedSet != "" {
		if dedicated, err = Parse(s.CPUDedicatedSet); err != nil {
			return nil, fmt.Errorf("numa: host: cpu_dedicated_set: %w", err)
		}
	}
	if s.CPUSharedSet != "" {
		if shared, err = Parse(s.CPUSharedSet); err != nil {
			return nil, fmt.Errorf("numa: host: cpu_shared_set: %w", err)
		}
	}
	var online CPUSet
	cells := make([]Cell, len(s.Cells))
	for i := range s.Cells {
		cs := &s.Cells[i]
		where := fmt.Sprintf("numa: host: cells[%d]", i)
		c := &cells[i]
		c.ID, c.MemoryMB, c.MemoryUsedMB, c.CPUUsage = cs.ID, cs.MemoryMB, cs.MemoryUsageMB, cs.CPUUsage
		c.Pages = append([]PagePool(nil), cs.MemPages...)
		if cs.Socket != nil {
			c.Socket = *cs.Socket
		}
		cpus, err := idSet(where+".cpus", cs.CPUs)
		if err != nil {
			return nil, err
		}
		if cs.CPUSet != nil {
			if c.CPUs, err = idSet(where+".cpuset", *cs.CPUSet); err != nil {
				return nil, err
			}
		}
		if cs.PCPUSet != nil {
			if c.PCPUs, err = idSet(where+".pcpuset", *cs.PCPUSet); err != nil {
				return nil, err
			}
		}
		if c.PinnedCPUs, err = idSet(where+".pinned_cpus", cs.PinnedCPUs); err != nil {
			return nil, err
		}
		online = online.Union(cpus).Union(c.CPUs).Union(c.PCPUs)
	}
	// Nova's libvirt driver: shared CPUs are cpu_shared_set, or every online
	// CPU when neither option is set; pinnable CPUs are cpu_dedicated_set,
	// or the shared ones under the legacy configuration.
	availShared := online
	switch {
	case !shared.IsEmpty():
		availShared = shared.Intersection(online)
	case !dedicated.IsEmpty():
		availShared = CPUSet{}
	}
	availDedicated := dedicated.Intersection(online)
	if availDedicated.IsEmpty() && shared.IsEmpty() {
		availDedicated = availShared
	}
	for i := range s.Cells {
		cs, c := &s.Cells[i], &cells[i]
		if cs.CPUSet == nil && cs.PCPUSet == nil {
			cpus, _ := idSet("", cs.CPUs)
			c.CPUs = cpus.Intersection(availShared)
			c.PCPUs = cpus.Intersection(availDedicated)
		}
		usable := c.CPUs.Union(c.PCPUs)
		if len(cs.Siblings) == 0 {
			for _, id := range usable.List() {
				c.Siblings = append(c.Siblings, NewCPUSet(id))
			}
		}
		for j, g := range cs.Siblings {
			set, err := idSet(fmt.Sprintf("numa: host: cells[%d].siblings[%d]", i, j), g)
			if err != nil {
				return nil, err
			}
			if set = set.Intersection(usable); !set.IsEmpty() {
				c.Siblings = append(c.Siblings, set)
			}
		}
	}
	h := &Host{Cells: cells, SharedSet: shared, PackCells: s.PackCells, Limits: limits}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return h, nil
}

// SpecOf returns the spec of a host, the inverse of HostSpec.Host.
func SpecOf(h *Host) HostSpec {
	list := func(c CPUSet) *[]int { l := c.List(); return &l }
	s := HostSpec{CPUSharedSet: h.SharedSet.String(), PackCells: h.PackCells}
	var dedicated CPUSet
	for _, c := range h.Cells {
		dedicated = dedicated.Union(c.PCPUs)
		socket := c.Socket
		cs := CellSpec{ID: c.ID, CPUs: c.CPUs.Union(c.PCPUs).List(), CPUSet: list(c.CPUs), PCPUSet: list(c.PCPUs),
			MemoryMB: c.MemoryMB, MemoryUsageMB: c.MemoryUsedMB, CPUUsage: c.CPUUsage, PinnedCPUs: c.PinnedCPUs.List(),
			MemPages: append([]PagePool(nil), c.Pages...), Socket: &socket}
		for _, g := range c.Siblings {
			cs.Siblings = append(cs.Siblings, g.List())
		}
		s.Cells = append(s.Cells, cs)
	}
	s.CPUDedicatedSet = dedicated.String()
	return s
}

// Case is one reference case: a host, a guest's flavor and image, limits.
type Case struct {
	ID       json.RawMessage `json:"id"`
	Host     HostSpec        `json:"host"`
	Instance InstanceSpec    `json:"instance"`
	Limits   *Limits         `json:"limits,omitempty"`
}

// InstanceSpec is a guest's flavor (vCPUs, memory, extra specs) and image
// properties. Property values may be JSON strings, numbers, booleans or
// lists; they are read as Nova reads them.
type InstanceSpec struct {
	VCPUs      int                        `json:"vcpus"`
	MemoryMB   int64                      `json:"memory_mb"`
	ExtraSpecs map[string]json.RawMessage `json:"extra_specs,omitempty"`
	ImageProps map[string]json.RawMessage `json:"image_props,omitempty"`
}

// Request builds the guest's request.
func (in *InstanceSpec) Request() (*Request, error) {
	es, err := flatten("extra_specs", in.ExtraSpecs)
	if err != nil {
		return nil, err
	}
	ip, err := flatten("image_props", in.ImageProps)
	if err != nil {
		return nil, err
	}
	return NewRequest(in.VCPUs, in.MemoryMB, es, ip)
}

// flatten turns JSON property values into the strings Nova compares.
func flatten(field string, m map[string]json.RawMessage) (map[string]string, error) {
	out := make(map[string]string, len(m))
	for k, raw := range m {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("numa: %s.%s: %w", field, k, err)
		}
		switch x := v.(type) {
		case string:
			out[k] = x
		case bool:
			out[k] = strconv.FormatBool(x)
		case float64:
			out[k] = strconv.FormatFloat(x, 'f', -1, 64)
		case nil:
		case []any:
			parts := make([]string, len(x))
			for i, e := range x {
				parts[i] = fmt.Sprint(e)
			}
			out[k] = strings.Join(parts, ",")
		default:
			return nil, fmt.Errorf("numa: %s.%s: %s is not a string, number, boolean or list", field, k, truncate(raw))
		}
	}
	return out, nil
}

// Answer is one line of the reference answer format.
type Answer struct {
	ID    json.RawMessage `json:"id"`
	Fit   bool            `json:"fit"`
	NUMA  *bool           `json:"numa,omitempty"`
	Error *AnswerError    `json:"error,omitempty"`
	// The placement's fields (emulator_threads_policy, cells, ...) are
	// inlined by MarshalJSON when the guest fits with a NUMA placement.
	Placement *Placement `json:"-"`
	// Why is the no-fit explanation; not part of Nova's format.
	Why string `json:"why,omitempty"`
}

// AnswerError is an invalid request in the answer format.
type AnswerError struct {
	Stage   string `json:"stage"`
	Type    string `json:"type"`
	Message string `json:"message"`
}

// MarshalJSON writes the answer with the placement's fields inlined.
func (a Answer) MarshalJSON() ([]byte, error) {
	type plain Answer
	head, err := json.Marshal(plain(a))
	if err != nil || a.Placement == nil || !a.Placement.HasNUMA() {
		return head, err
	}
	body, err := json.Marshal(a.Placement)
	if err != nil {
		return nil, err
	}
	// Splice the two objects: {"id":..,"fit":..} + {"cells":..}.
	out := append(head[:len(head)-1:len(head)-1], ',')
	return append(out, body[1:]...), nil
}

// UnmarshalJSON reads an answer line, placement included.
func (a *Answer) UnmarshalJSON(data []byte) error {
	type plain Answer
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	*a = Answer(p)
	if a.Fit && a.NUMA != nil && *a.NUMA {
		var pl Placement
		if err := json.Unmarshal(data, &pl); err != nil {
			return err
		}
		a.Placement = &pl
	}
	return nil
}

// Solve answers a case: the request's validity, then Fit.
func (c *Case) Solve() Answer {
	ans := Answer{ID: c.ID}
	host, err := c.Host.Host(c.Limits)
	if err != nil {
		ans.Error = &AnswerError{Stage: "input", Type: "InvalidHost", Message: err.Error()}
		return ans
	}
	req, err := c.Instance.Request()
	if err != nil {
		ans.Error = answerError(err)
		return ans
	}
	return Solve(c.ID, host, req)
}

// Solve answers one fit of req on host in the answer format.
func Solve(id json.RawMessage, host *Host, req *Request) Answer {
	ans := Answer{ID: id}
	numa := req.HasNUMA()
	p, err := Fit(host, req)
	if err != nil {
		ans.Why = err.Error()
		return ans
	}
	ans.Fit, ans.NUMA = true, &numa
	if numa {
		ans.Placement = p
	}
	return ans
}

func answerError(err error) *AnswerError {
	if ie, ok := err.(*InvalidRequestError); ok {
		return &AnswerError{Stage: "constraints", Type: ie.Kind, Message: ie.Message}
	}
	return &AnswerError{Stage: "input", Type: "InvalidInput", Message: err.Error()}
}

// ReadCases reads a JSON array of cases, a single case object, or JSON
// lines of cases. A malformed case is an error naming its position and,
// where it has one, its id.
func ReadCases(data []byte) ([]Case, error) {
	trimmed := strings.TrimSpace(string(data))
	if trimmed == "" {
		return nil, nil
	}
	var raws []json.RawMessage
	if strings.HasPrefix(trimmed, "[") {
		if err := json.Unmarshal([]byte(trimmed), &raws); err != nil {
			return nil, fmt.Errorf("numa: cases: not a JSON array of cases: %w", err)
		}
	} else {
		dec := json.NewDecoder(strings.NewReader(trimmed))
		for dec.More() {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, fmt.Errorf("numa: cases: case %d: %w", len(raws), err)
			}
			raws = append(raws, raw)
		}
	}
	cases := make([]Case, len(raws))
	for i, raw := range raws {
		if err := decodeCase(raw, &cases[i]); err != nil {
			return nil, fmt.Errorf("numa: cases: case %d%s: %w", i, caseIDSuffix(raw), err)
		}
	}
	return cases, nil
}

func decodeCase(raw json.RawMessage, c *Case) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return fmt.Errorf("not a JSON object")
	}
	for _, req := range []string{"host", "instance"} {
		if _, ok := fields[req]; !ok {
			return fmt.Errorf("field %q is missing", req)
		}
	}
	for _, name := range []string{"id", "host", "instance", "limits"} {
		v, ok := fields[name]
		if !ok {
			continue
		}
		var err error
		switch name {
		case "id":
			c.ID = v
		case "host":
			err = json.Unmarshal(v, &c.Host)
		case "instance":
			err = json.Unmarshal(v, &c.Instance)
			if err == nil && (c.Instance.VCPUs == 0 || c.Instance.MemoryMB == 0) {
				err = fmt.Errorf("vcpus and memory_mb are required and must be positive")
			}
		case "limits":
			err = json.Unmarshal(v, &c.Limits)
		}
		if err != nil {
			return fmt.Errorf("field %q: %w", name, err)
		}
	}
	return nil
}

func caseIDSuffix(raw json.RawMessage) string {
	var probe struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(raw, &probe) == nil && len(probe.ID) > 0 {
		return " (id " + string(probe.ID) + ")"
	}
	return ""
}

// SortedPins returns the cell's pins as "vcpu:pcpu" pairs in vCPU order.
func (c *PlacedCell) SortedPins() [][2]int {
	out := make([][2]int, 0, len(c.Pins))
	for v, p := range c.Pins {
		out = append(out, [2]int{v, p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}
