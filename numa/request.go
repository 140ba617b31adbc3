package numa

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// CPUPolicy is hw:cpu_policy: whether vCPUs float or are pinned 1:1.
type CPUPolicy string

// CPU policies; the zero value means unset (shared, no NUMA topology forced).
const (
	CPUPolicyDedicated CPUPolicy = "dedicated"
	CPUPolicyShared    CPUPolicy = "shared"
	CPUPolicyMixed     CPUPolicy = "mixed"
)

// Pinned reports whether the policy pins vCPUs (dedicated or mixed).
func (p CPUPolicy) Pinned() bool { return p == CPUPolicyDedicated || p == CPUPolicyMixed }

// ThreadPolicy is hw:cpu_thread_policy: how pinned vCPUs use SMT siblings.
type ThreadPolicy string

// Thread policies; the zero value behaves as prefer.
const (
	ThreadPolicyPrefer  ThreadPolicy = "prefer"
	ThreadPolicyIsolate ThreadPolicy = "isolate"
	ThreadPolicyRequire ThreadPolicy = "require"
)

// EmulatorPolicy is hw:emulator_threads_policy: where QEMU's own threads run.
type EmulatorPolicy string

// Emulator thread policies; the zero value means unset.
const (
	EmulatorPolicyShare   EmulatorPolicy = "share"
	EmulatorPolicyIsolate EmulatorPolicy = "isolate"
)

// PageSize is a guest cell's requested page size in KiB, or one of the
// symbolic requests below. Zero means no request.
type PageSize int64

// Symbolic page size requests, as Nova encodes them.
const (
	PageSizeSmall PageSize = -1 // the smallest size the host offers
	PageSizeLarge PageSize = -2 // any size but the smallest, largest first
	PageSizeAny   PageSize = -3 // any size, largest first
)

// String returns the hw:mem_page_size spelling of the request.
func (p PageSize) String() string {
	switch p {
	case 0:
		return ""
	case PageSizeSmall:
		return "small"
	case PageSizeLarge:
		return "large"
	case PageSizeAny:
		return "any"
	}
	return strconv.FormatInt(int64(p), 10)
}

// DefaultRealtimePriority is the SCHED_FIFO priority of realtime vCPUs
// (Nova's [libvirt] realtime_scheduler_priority default).
const DefaultRealtimePriority = 1

// Request is what a guest asks of a host's NUMA cells.
type Request struct {
	VCPUs    int   `json:"vcpus"`
	MemoryMB int64 `json:"memory_mb"`
	// Cells is the guest NUMA topology; empty when the flavor and image
	// force none, in which case the guest fits any host here.
	Cells          []GuestCell    `json:"cells,omitempty"`
	EmulatorPolicy EmulatorPolicy `json:"emulator_threads_policy,omitempty"`
	// RealtimeVCPUs run with SCHED_FIFO at RealtimePriority.
	RealtimeVCPUs    CPUSet `json:"realtime_vcpus"`
	RealtimePriority int    `json:"realtime_priority,omitempty"`
	LockedMemory     bool   `json:"locked_memory,omitempty"`
	// PCI are the groups of PCI devices the guest asks for, each with its
	// NUMA policy settled (AddDevices).
	PCI []PCIRequest `json:"pci_requests,omitempty"`
	// Network is the NUMA affinity of the guest's networks; nil when it
	// asks for none.
	Network *NetworkAffinity `json:"network_metadata,omitempty"`
}

// GuestCell is one guest NUMA cell.
type GuestCell struct {
	ID int `json:"id"`
	// SharedVCPUs float over the host cell's shared CPUs.
	SharedVCPUs CPUSet `json:"cpuset"`
	// DedicatedVCPUs are each pinned to one host pCPU.
	DedicatedVCPUs CPUSet       `json:"pcpuset"`
	MemoryMB       int64        `json:"memory_mb"`
	PageSize       PageSize     `json:"pagesize,omitempty"`
	CPUPolicy      CPUPolicy    `json:"cpu_policy,omitempty"`
	ThreadPolicy   ThreadPolicy `json:"cpu_thread_policy,omitempty"`
}

// HasNUMA reports whether the request asks for a NUMA placement.
func (r *Request) HasNUMA() bool { return len(r.Cells) > 0 }

// InvalidRequestError says why a flavor and image do not make a valid
// request. Kind is the name Nova gives the same rejection.
type InvalidRequestError struct {
	Kind    string
	Message string
}

func (e *InvalidRequestError) Error() string { return "numa: invalid request: " + e.Message }

func invalid(kind, format string, args ...any) error {
	return &InvalidRequestError{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// maxGuestCells bounds hw:numa_nodes, as Nova's NUMA_NODES_MAX.
const maxGuestCells = 128

var (
	resourceVCPU = regexp.MustCompile(`^resources([1-9][0-9]*)?:VCPU`)
	resourcePCPU = regexp.MustCompile(`^resources([1-9][0-9]*)?:PCPU`)
	traitSMT     = regexp.MustCompile(`^trait([1-9][0-9]*)?:HW_CPU_HYPERTHREADING`)
)

// specs reads a flavor's extra specs (hw:key) and an image's properties
// (hw_key) side by side.
type specs struct {
	flavor, image map[string]string
}

func (s specs) get(key string) (flavor, image string) {
	return s.flavor["hw:"+key], s.image["hw_"+key]
}

// NewRequest builds the request a guest of vcpus and memoryMB makes under
// the given flavor extra specs and image properties, with Nova's rules for
// which source wins and which combinations are invalid. The specs and
// properties are first validated as Nova's API does (ValidateExtraSpecs,
// ValidateImageProps). An invalid request is an *InvalidRequestError; the
// request is nil.
func NewRequest(vcpus int, memoryMB int64, extraSpecs, imageProps map[string]string) (*Request, error) {
	if err := ValidateExtraSpecs(extraSpecs); err != nil {
		return nil, err
	}
	if err := ValidateImageProps(imageProps); err != nil {
		return nil, err
	}
	return newRequest(vcpus, memoryMB, extraSpecs, imageProps)
}

// newRequest is NewRequest without the API's validation: Nova's own
// request building, which its reference cases exercise directly.
func newRequest(vcpus int, memoryMB int64, extraSpecs, imageProps map[string]string) (*Request, error) {
	if err := checkSize(vcpus, memoryMB); err != nil {
		return nil, err
	}
	s := specs{flavor: extraSpecs, image: imageProps}
	if err := imagePCIPolicy(s); err != nil {
		return nil, err
	}
	all := Range(0, vcpus-1)
	// The order of the steps decides which fault a request with several
	// is refused for; the tests against Nova's answers hold it.
	cpu, err := readCPUKnobs(s, vcpus, all)
	if err != nil {
		return nil, err
	}
	dedicated, err := cpu.checkPolicy(all)
	if err != nil {
		return nil, err
	}
	mem, err := readMemoryKnobs(s)
	if err != nil {
		return nil, err
	}
	req := &Request{VCPUs: vcpus, MemoryMB: memoryMB, EmulatorPolicy: cpu.emulator,
		RealtimeVCPUs: cpu.realtime, LockedMemory: mem.locked}
	if !cpu.realtime.IsEmpty() {
		req.RealtimePriority = DefaultRealtimePriority
	}
	if !mem.forcesTopology() && !cpu.policy.Pinned() {
		return req, nil
	}
	if req.Cells, err = guestCells(s, all, dedicated, mem.nodes, memoryMB); err != nil {
		return nil, err
	}
	for i := range req.Cells {
		req.Cells[i].PageSize = mem.pageSize
		req.Cells[i].CPUPolicy = cpu.policy
		req.Cells[i].ThreadPolicy = cpu.threads
	}
	return req, nil
}

// cpuKnobs are the flavor's and image's CPU settings, each source already
// reconciled with the other.
type cpuKnobs struct {
	policy        CPUPolicy
	threads       ThreadPolicy
	emulator      EmulatorPolicy
	realtime      CPUSet
	dedicatedMask CPUSet
}

func readCPUKnobs(s specs, vcpus int, all CPUSet) (cpuKnobs, error) {
	var k cpuKnobs
	var err error
	if k.policy, err = cpuPolicy(s); err != nil {
		return cpuKnobs{}, err
	}
	if k.threads, err = threadPolicy(s); err != nil {
		return cpuKnobs{}, err
	}
	if k.emulator, err = emulatorPolicy(s); err != nil {
		return cpuKnobs{}, err
	}
	if k.realtime, err = realtimeVCPUs(s, all, k.emulator); err != nil {
		return cpuKnobs{}, err
	}
	if k.dedicatedMask, err = dedicatedVCPUs(s, all); err != nil {
		return cpuKnobs{}, err
	}
	// Resources and traits come last: they stand in for a policy the
	// flavor did not set, and refuse one it did.
	if k.policy, err = resourceRequests(s, k.policy, vcpus, k.emulator); err != nil {
		return cpuKnobs{}, err
	}
	if k.threads, err = hyperthreadingTrait(s, k.threads); err != nil {
		return cpuKnobs{}, err
	}
	return k, nil
}

// checkPolicy refuses settings that the CPU policy does not allow, and
// returns the vCPUs pinned 1:1 under it.
func (k cpuKnobs) checkPolicy(all CPUSet) (CPUSet, error) {
	switch k.policy {
	case "", CPUPolicyShared:
		switch {
		case k.threads != "":
			return CPUSet{}, invalid("CPUThreadPolicyConfigurationInvalid",
				"hw:cpu_thread_policy=%s needs hw:cpu_policy dedicated or mixed", k.threads)
		case k.emulator == EmulatorPolicyIsolate:
			return CPUSet{}, invalid("BadRequirementEmulatorThreadsPolicy",
				"hw:emulator_threads_policy=isolate needs hw:cpu_policy dedicated or mixed")
		case !k.dedicatedMask.IsEmpty():
			return CPUSet{}, invalid("RequiredMixedInstancePolicy", "hw:cpu_dedicated_mask needs hw:cpu_policy=mixed")
		case !k.realtime.IsEmpty():
			return CPUSet{}, invalid("RealtimeConfigurationInvalid", "hw:cpu_realtime needs hw:cpu_policy dedicated or mixed")
		}
	case CPUPolicyDedicated:
		if !k.dedicatedMask.IsEmpty() {
			return CPUSet{}, invalid("RequiredMixedInstancePolicy", "hw:cpu_dedicated_mask needs hw:cpu_policy=mixed, not dedicated")
		}
		return all, nil
	case CPUPolicyMixed:
		if k.realtime.IsEmpty() == k.dedicatedMask.IsEmpty() {
			return CPUSet{}, invalid("RequiredMixedOrRealtimeCPUMask",
				"hw:cpu_policy=mixed needs exactly one of hw:cpu_dedicated_mask or hw:cpu_realtime_mask")
		}
		// Under mixed, realtime vCPUs are the dedicated ones.
		if k.dedicatedMask.IsEmpty() {
			return k.realtime, nil
		}
	}
	return k.dedicatedMask, nil
}

// memoryKnobs are the flavor's and image's memory and topology settings.
type memoryKnobs struct {
	nodes    int // hw:numa_nodes; 0 when unset
	pageSize PageSize
	locked   bool
	vpmem    bool // the flavor asks for virtual persistent memory
}

func readMemoryKnobs(s specs) (memoryKnobs, error) {
	var k memoryKnobs
	var err error
	if k.nodes, err = nodeCount(s); err != nil {
		return memoryKnobs{}, err
	}
	if k.pageSize, err = pageSizeRequest(s); err != nil {
		return memoryKnobs{}, err
	}
	if k.locked, err = lockedMemory(s); err != nil {
		return memoryKnobs{}, err
	}
	k.vpmem = strings.TrimSpace(s.flavor["hw:pmem"]) != ""
	return k, nil
}

// forcesTopology reports whether the memory settings alone give the guest
// a NUMA topology, as Nova does for a node count, a page size or vPMEM.
func (k memoryKnobs) forcesTopology() bool {
	return k.nodes != 0 || k.pageSize != 0 || k.vpmem
}

// guestCells lays the guest's vCPUs and memory out over its cells: evenly
// over hw:numa_nodes (one when unset), or as hw:numa_cpus.N and
// hw:numa_mem.N say. Those lists are read only here, as Nova ignores them
// for a guest without a topology.
func guestCells(s specs, all, dedicated CPUSet, nodes int, memoryMB int64) ([]GuestCell, error) {
	if nodes == 0 {
		nodes = 1
	}
	shared := all.Difference(dedicated)
	cpuLists, err := numaCPULists(s)
	if err != nil {
		return nil, err
	}
	memLists, err := numaMemLists(s)
	if err != nil {
		return nil, err
	}
	switch {
	case cpuLists == nil && memLists == nil:
		return evenCells(nodes, all, shared, dedicated, memoryMB)
	case cpuLists != nil && memLists != nil:
		if len(cpuLists) != nodes || len(memLists) != nodes {
			return nil, invalid("ImageNUMATopologyIncomplete",
				"hw:numa_nodes=%d but %d hw:numa_cpus.N and %d hw:numa_mem.N are given; give one of each for nodes 0-%d",
				nodes, len(cpuLists), len(memLists), nodes-1)
		}
		return manualCells(cpuLists, memLists, all, shared, dedicated, memoryMB)
	}
	return nil, invalid("ImageNUMATopologyIncomplete", "hw:numa_cpus.N and hw:numa_mem.N must be given together")
}

func evenCells(nodes int, all, shared, dedicated CPUSet, memoryMB int64) ([]GuestCell, error) {
	vcpus := all.Len()
	if vcpus%nodes != 0 || memoryMB%int64(nodes) != 0 {
		return nil, invalid("ImageNUMATopologyAsymmetric",
			"%d vCPUs and %d MiB cannot be split evenly over hw:numa_nodes=%d; give hw:numa_cpus.N and hw:numa_mem.N",
			vcpus, memoryMB, nodes)
	}
	per := vcpus / nodes
	var cells []GuestCell
	for n := 0; n < nodes; n++ {
		cpus := Range(n*per, (n+1)*per-1)
		cells = append(cells, GuestCell{ID: n, SharedVCPUs: cpus.Intersection(shared),
			DedicatedVCPUs: cpus.Intersection(dedicated), MemoryMB: memoryMB / int64(nodes)})
	}
	return cells, nil
}

func cpuPolicy(s specs) (CPUPolicy, error) {
	f, i := s.get("cpu_policy")
	allowed := "dedicated, shared or mixed"
	for _, v := range []struct{ src, val string }{{"hw:cpu_policy", f}, {"hw_cpu_policy", i}} {
		switch CPUPolicy(v.val) {
		case "", CPUPolicyDedicated, CPUPolicyShared, CPUPolicyMixed:
		default:
			return "", invalid("InvalidCPUAllocationPolicy", "%s=%q: allowed values are %s", v.src, v.val, allowed)
		}
	}
	fp, ip := CPUPolicy(f), CPUPolicy(i)
	switch fp {
	case CPUPolicyDedicated:
		return fp, nil
	case CPUPolicyMixed:
		if ip == CPUPolicyDedicated {
			return "", invalid("ImageCPUPinningForbidden", "image hw_cpu_policy=dedicated conflicts with flavor hw:cpu_policy=mixed")
		}
		return fp, nil
	case CPUPolicyShared:
		if ip == CPUPolicyMixed || ip == CPUPolicyDedicated {
			return "", invalid("ImageCPUPinningForbidden", "image hw_cpu_policy=%s conflicts with flavor hw:cpu_policy=shared", ip)
		}
		return fp, nil
	}
	return ip, nil
}

func threadPolicy(s specs) (ThreadPolicy, error) {
	f, i := s.get("cpu_thread_policy")
	for _, v := range []struct{ src, val string }{{"hw:cpu_thread_policy", f}, {"hw_cpu_thread_policy", i}} {
		switch ThreadPolicy(v.val) {
		case "", ThreadPolicyPrefer, ThreadPolicyIsolate, ThreadPolicyRequire:
		default:
			return "", invalid("InvalidCPUThreadAllocationPolicy", "%s=%q: allowed values are prefer, isolate or require", v.src, v.val)
		}
	}
	fp, ip := ThreadPolicy(f), ThreadPolicy(i)
	switch fp {
	case "":
		return ip, nil
	case ThreadPolicyPrefer:
		return fp, nil
	}
	if ip != "" && ip != fp {
		return "", invalid("ImageCPUThreadPolicyForbidden", "image hw_cpu_thread_policy=%s conflicts with flavor hw:cpu_thread_policy=%s", ip, fp)
	}
	return fp, nil
}

func emulatorPolicy(s specs) (EmulatorPolicy, error) {
	v := s.flavor["hw:emulator_threads_policy"]
	switch EmulatorPolicy(v) {
	case "", EmulatorPolicyShare, EmulatorPolicyIsolate:
		return EmulatorPolicy(v), nil
	}
	return "", invalid("InvalidEmulatorThreadsPolicy", "hw:emulator_threads_policy=%q: allowed values are share or isolate", v)
}

// parseMask reads a vCPU mask; a mask starting with "^" excludes from all
// vCPUs, as Nova's masks do.
func parseMask(key, mask string, all CPUSet) (CPUSet, error) {
	spec := mask
	if strings.HasPrefix(strings.TrimSpace(mask), "^") {
		spec = all.String() + "," + mask
	}
	set, err := Parse(spec)
	if err != nil {
		return CPUSet{}, invalid("Invalid", "%s=%q is not a cpuset-list such as 0-3,^2", key, mask)
	}
	return set, nil
}

func realtimeVCPUs(s specs, all CPUSet, emulator EmulatorPolicy) (CPUSet, error) {
	if !boolFromString(s.flavor["hw:cpu_realtime"]) {
		return CPUSet{}, nil
	}
	key, mask := "hw_cpu_realtime_mask", s.image["hw_cpu_realtime_mask"]
	if mask == "" {
		key, mask = "hw:cpu_realtime_mask", s.flavor["hw:cpu_realtime_mask"]
	}
	rt := all
	if mask != "" {
		var err error
		if rt, err = parseMask(key, mask, all); err != nil {
			return CPUSet{}, err
		}
	}
	switch {
	case rt.IsEmpty():
		return CPUSet{}, invalid("RealtimeMaskNotFoundOrInvalid", "%s=%q selects no vCPU", key, mask)
	case rt.Equal(all) && emulator == "":
		return CPUSet{}, invalid("RealtimeMaskNotFoundOrInvalid",
			"realtime on every vCPU (%s) needs hw:emulator_threads_policy; or give hw:cpu_realtime_mask", all)
	case !rt.IsSubsetOf(all):
		return CPUSet{}, invalid("RealtimeMaskNotFoundOrInvalid", "%s=%q names vCPUs outside 0-%d", key, mask, all.Max())
	}
	return rt, nil
}

func dedicatedVCPUs(s specs, all CPUSet) (CPUSet, error) {
	mask := s.flavor["hw:cpu_dedicated_mask"]
	if mask == "" {
		return CPUSet{}, nil
	}
	ded, err := parseMask("hw:cpu_dedicated_mask", mask, all)
	if err != nil {
		return CPUSet{}, err
	}
	if ded.IsEmpty() || all.Difference(ded).IsEmpty() {
		return CPUSet{}, invalid("InvalidMixedInstanceDedicatedMask",
			"hw:cpu_dedicated_mask=%q must leave both dedicated and shared vCPUs among 0-%d", mask, all.Max())
	}
	if !ded.IsSubsetOf(all) {
		return CPUSet{}, invalid("InvalidMixedInstanceDedicatedMask", "hw:cpu_dedicated_mask=%q names vCPUs outside 0-%d", mask, all.Max())
	}
	return ded, nil
}

// resourceRequests applies explicit resources:VCPU / resources:PCPU extra
// specs, which imply a CPU policy.
func resourceRequests(s specs, policy CPUPolicy, vcpus int, emulator EmulatorPolicy) (CPUPolicy, error) {
	var reqVCPU, reqPCPU int
	for k, v := range s.flavor {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			continue
		}
		if resourceVCPU.MatchString(k) {
			reqVCPU += n
		}
		if resourcePCPU.MatchString(k) {
			reqPCPU += n
		}
	}
	if policy != "" && (reqVCPU != 0 || reqPCPU != 0) {
		return "", invalid("InvalidRequest", "resources:VCPU or resources:PCPU cannot be combined with hw:cpu_policy; use one or the other")
	}
	if reqVCPU != 0 && reqPCPU != 0 {
		return "", invalid("InvalidRequest", "resources:VCPU and resources:PCPU cannot both be given; use one or the other")
	}
	if reqPCPU != 0 {
		want := vcpus
		if emulator == EmulatorPolicyIsolate {
			want++
		}
		if reqPCPU != want {
			return "", invalid("InvalidRequest", "resources:PCPU=%d but this flavor needs exactly %d PCPUs", reqPCPU, want)
		}
		return CPUPolicyDedicated, nil
	}
	if reqVCPU != 0 {
		return CPUPolicyShared, nil
	}
	return policy, nil
}

func hyperthreadingTrait(s specs, threads ThreadPolicy) (ThreadPolicy, error) {
	trait := ""
	keys := make([]string, 0, len(s.flavor))
	for k := range s.flavor {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if traitSMT.MatchString(k) {
			trait = s.flavor[k]
			break
		}
	}
	if trait == "" {
		for _, t := range strings.Split(s.image["traits_required"], ",") {
			if strings.TrimSpace(t) == "HW_CPU_HYPERTHREADING" {
				trait = "required"
			}
		}
	}
	if trait != "" && threads != "" {
		return "", invalid("InvalidRequest", "trait:HW_CPU_HYPERTHREADING cannot be combined with hw:cpu_thread_policy; use one or the other")
	}
	switch trait {
	case "forbidden":
		return ThreadPolicyIsolate, nil
	case "required":
		return ThreadPolicyRequire, nil
	}
	return threads, nil
}

func nodeCount(s specs) (int, error) {
	f, i := s.get("numa_nodes")
	if f != "" && i != "" {
		return 0, invalid("ImageNUMATopologyForbidden", "image hw_numa_nodes cannot be combined with flavor hw:numa_nodes")
	}
	v, key := f, "hw:numa_nodes"
	if v == "" {
		v, key = i, "hw_numa_nodes"
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || strconv.Itoa(n) != v || n < 1 || n > maxGuestCells {
		return 0, invalid("InvalidNUMANodesNumber", "%s=%q: must be a whole number from 1 to %d", key, v, maxGuestCells)
	}
	return n, nil
}

func pageSizeRequest(s specs) (PageSize, error) {
	f, i := s.get("mem_page_size")
	if f == "" && i != "" {
		return 0, invalid("MemoryPageSizeForbidden", "image hw_mem_page_size=%q needs flavor hw:mem_page_size large or any", i)
	}
	if f == "" {
		return 0, nil
	}
	p, err := parsePageSize("hw:mem_page_size", f)
	if err != nil {
		return 0, err
	}
	if i != "" {
		if p != PageSizeAny && p != PageSizeLarge {
			return 0, invalid("MemoryPageSizeForbidden", "image hw_mem_page_size=%q cannot override flavor hw:mem_page_size=%q; only large or any can be refined", i, f)
		}
		return parsePageSize("hw_mem_page_size", i)
	}
	return p, nil
}

var byteSize = regexp.MustCompile(`^([-+]?\d*\.?\d+)([KMGT]i?)?(b|bit|B)$`)

// parsePageSize reads small, large, any, a size in KiB ("2048") or a size
// with a unit ("2MB", "1GiB"), as Nova does.
func parsePageSize(key, v string) (PageSize, error) {
	switch v {
	case "small":
		return PageSizeSmall, nil
	case "large":
		return PageSizeLarge, nil
	case "any":
		return PageSizeAny, nil
	}
	bad := invalid("MemoryPageSizeInvalid", "%s=%q: allowed values are small, large, any, a size in KiB (2048) or with a unit (2MB, 1GB)", key, v)
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n == 0 {
			return 0, bad
		}
		return PageSize(n), nil
	}
	m := byteSize.FindStringSubmatch(v)
	if m == nil {
		return 0, bad
	}
	mag, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, bad
	}
	if m[3] != "B" {
		mag /= 8
	}
	exp := map[string]float64{"": 0, "K": 1, "Ki": 1, "M": 2, "Mi": 2, "G": 3, "Gi": 3, "T": 4, "Ti": 4}[m[2]]
	kib := math.Ceil(mag*math.Pow(1024, exp)) / 1024
	if kib <= 0 || kib != math.Trunc(kib) {
		return 0, bad
	}
	return PageSize(kib), nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func lockedMemory(s specs) (bool, error) {
	fv, fok := s.flavor["hw:locked_memory"]
	iv, iok := s.image["hw_locked_memory"]
	locked := iok && boolFromString(iv)
	if fok {
		f := boolFromString(fv)
		if iok && f != boolFromString(iv) {
			return false, invalid("FlavorImageLockedMemoryConflict", "flavor hw:locked_memory=%q conflicts with image hw_locked_memory=%q", fv, iv)
		}
		locked = f
	}
	pf, pi := s.get("mem_page_size")
	if locked && pf == "" && pi == "" {
		return false, invalid("LockMemoryForbidden", "hw:locked_memory needs hw:mem_page_size")
	}
	return locked, nil
}

// boolFromString reads a flag the way Nova does: 1, t, true, on, y, yes.
func boolFromString(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "t", "true", "on", "y", "yes":
		return true
	}
	return false
}

// numaCPULists reads hw:numa_cpus.N (flavor) or hw_numa_cpus.N (image), N
// from 0 up to the first missing index; nil when neither is given.
func numaCPULists(s specs) ([]CPUSet, error) {
	read := func(m map[string]string, prefix string) ([]CPUSet, error) {
		var out []CPUSet
		for n := 0; n < maxGuestCells; n++ {
			key := fmt.Sprintf("%s.%d", prefix, n)
			v, ok := m[key]
			if !ok {
				break
			}
			set, err := Parse(v)
			if err != nil {
				return nil, invalid("Invalid", "%s=%q is not a cpuset-list such as 0-3", key, v)
			}
			out = append(out, set)
		}
		return out, nil
	}
	f, err := read(s.flavor, "hw:numa_cpus")
	if err != nil {
		return nil, err
	}
	i, err := read(s.image, "hw_numa_cpus")
	if err != nil {
		return nil, err
	}
	if f != nil && i != nil {
		return nil, invalid("ImageNUMATopologyForbidden", "image hw_numa_cpus cannot be combined with flavor hw:numa_cpus")
	}
	if f != nil {
		return f, nil
	}
	return i, nil
}

func numaMemLists(s specs) ([]int64, error) {
	read := func(m map[string]string, prefix string) ([]int64, error) {
		var out []int64
		for n := 0; n < maxGuestCells; n++ {
			key := fmt.Sprintf("%s.%d", prefix, n)
			v, ok := m[key]
			if !ok {
				break
			}
			mb, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || mb < 0 {
				return nil, invalid("Invalid", "%s=%q must be a whole number of MiB", key, v)
			}
			out = append(out, mb)
		}
		return out, nil
	}
	f, err := read(s.flavor, "hw:numa_mem")
	if err != nil {
		return nil, err
	}
	i, err := read(s.image, "hw_numa_mem")
	if err != nil {
		return nil, err
	}
	if f != nil && i != nil {
		return nil, invalid("ImageNUMATopologyForbidden", "image hw_numa_mem cannot be combined with flavor hw:numa_mem")
	}
	if f != nil {
		return f, nil
	}
	return i, nil
}

func manualCells(cpuLists []CPUSet, memLists []int64, all, shared, dedicated CPUSet, memoryMB int64) ([]GuestCell, error) {
	var cells []GuestCell
	var assigned CPUSet
	var total int64
	for n := range cpuLists {
		cpus := cpuLists[n]
		if out := cpus.Difference(all); !out.IsEmpty() {
			return nil, invalid("ImageNUMATopologyCPUOutOfRange",
				"hw:numa_cpus.%d names vCPU %d; vCPUs are 0-%d", n, out.Min(), all.Max())
		}
		if dup := cpus.Intersection(assigned); !dup.IsEmpty() {
			return nil, invalid("ImageNUMATopologyCPUDuplicates", "vCPU %d is in more than one hw:numa_cpus.N", dup.Min())
		}
		assigned = assigned.Union(cpus)
		cells = append(cells, GuestCell{ID: n, SharedVCPUs: cpus.Intersection(shared),
			DedicatedVCPUs: cpus.Intersection(dedicated), MemoryMB: memLists[n]})
		total += memLists[n]
	}
	if rest := all.Difference(assigned); !rest.IsEmpty() {
		return nil, invalid("ImageNUMATopologyCPUsUnassigned", "vCPUs %s are in no hw:numa_cpus.N", rest)
	}
	if total != memoryMB {
		return nil, invalid("ImageNUMATopologyMemoryOutOfRange",
			"hw:numa_mem.N add up to %d MiB but the flavor has %d MiB", total, memoryMB)
	}
	return cells, nil
}
