package numa

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Case is one reference case: a host, a guest's flavor and image, limits.
type Case struct {
	ID       json.RawMessage `json:"id"`
	Host     HostSpec        `json:"host"`
	Instance InstanceSpec    `json:"instance"`
	Limits   *Limits         `json:"limits,omitempty"`
}

// InstanceSpec is a guest's flavor (vCPUs, memory, extra specs) and image
// properties, and the PCI devices and network affinity it asks for.
// Property values may be JSON strings, numbers, booleans or lists; they are
// read as Nova reads them.
type InstanceSpec struct {
	VCPUs      int                        `json:"vcpus"`
	MemoryMB   int64                      `json:"memory_mb"`
	ExtraSpecs map[string]json.RawMessage `json:"extra_specs,omitempty"`
	ImageProps map[string]json.RawMessage `json:"image_props,omitempty"`
	// PCIRequests are Nova's InstancePCIRequests (from PCI aliases and
	// SR-IOV ports); NetworkMetadata the physnets and tunneled networks of
	// its ports.
	PCIRequests     []PCIRequest     `json:"pci_requests,omitempty"`
	NetworkMetadata *NetworkAffinity `json:"network_metadata,omitempty"`
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
	// The reference cases are answers of Nova's hardware layer, which
	// sees specs the API has already validated, or not at all.
	req, err := newRequest(in.VCPUs, in.MemoryMB, es, ip)
	if err != nil {
		return nil, err
	}
	if err := req.AddDevices(in.PCIRequests, in.NetworkMetadata, es, ip); err != nil {
		return nil, err
	}
	return req, nil
}

// schedulerLimits are the allocation ratios Nova's scheduler passes by
// default (cpu_allocation_ratio 16, ram_allocation_ratio 1.5).
var schedulerLimits = Limits{CPUAllocationRatio: 16, RAMAllocationRatio: 1.5}

// limits are the case's limits. A guest's network affinity travels to
// Nova's fit inside its limits, so a case with network affinity and no
// limits is fitted with the default ratios, as the scheduler does.
func (c *Case) limits() *Limits {
	if c.Limits == nil && c.Instance.NetworkMetadata != nil {
		l := schedulerLimits
		return &l
	}
	return c.Limits
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
	// inlined by MarshalJSON when the guest fits with a NUMA placement;
	// without one, only its pci_devices are, when it takes any.
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
	if err != nil || a.Placement == nil || (!a.Placement.HasNUMA() && len(a.Placement.Devices) == 0) {
		return head, err
	}
	var body []byte
	if a.Placement.HasNUMA() {
		body, err = json.Marshal(a.Placement)
	} else {
		body, err = json.Marshal(struct {
			Devices []DeviceTake `json:"pci_devices"`
		}{a.Placement.Devices})
	}
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
	if !a.Fit {
		return nil
	}
	if a.NUMA != nil && *a.NUMA {
		var pl Placement
		if err := json.Unmarshal(data, &pl); err != nil {
			return err
		}
		a.Placement = &pl
		return nil
	}
	var devs struct {
		Devices []DeviceTake `json:"pci_devices"`
	}
	if err := json.Unmarshal(data, &devs); err != nil {
		return err
	}
	if len(devs.Devices) > 0 {
		a.Placement = &Placement{Devices: devs.Devices}
	}
	return nil
}

// Solve answers a case: the request's validity, then Fit.
func (c *Case) Solve() Answer {
	ans := Answer{ID: c.ID}
	host, req, err := c.Inputs()
	if err != nil {
		ans.Error = answerError(err)
		return ans
	}
	return Solve(c.ID, host, req)
}

// Inputs returns the case's host, with its limits, and the guest's
// request. A bad host is an error of its own; an invalid request is an
// *InvalidRequestError.
func (c *Case) Inputs() (*Host, *Request, error) {
	host, err := c.Host.Host(c.limits())
	if err != nil {
		return nil, nil, &hostError{err}
	}
	req, err := c.Instance.Request()
	if err != nil {
		return nil, nil, err
	}
	return host, req, nil
}

// hostError marks an error in a case's host, which answers as InvalidHost.
type hostError struct{ err error }

func (e *hostError) Error() string { return e.err.Error() }
func (e *hostError) Unwrap() error { return e.err }

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
	if numa || len(p.Devices) > 0 {
		ans.Placement = p
	}
	return ans
}

func answerError(err error) *AnswerError {
	if he, ok := err.(*hostError); ok {
		return &AnswerError{Stage: "input", Type: "InvalidHost", Message: he.Error()}
	}
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
