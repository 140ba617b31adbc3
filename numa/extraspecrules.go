package numa

import (
	"math/big"
	"regexp"
	"sort"
	"strings"
)

// specRule is an extra spec Nova knows. Its name may hold {placeholders},
// each standing for a pattern; as in Nova, the name with its placeholders
// expanded is matched as a regular expression, so the "." of
// hw:numa_cpus.{id} matches any character.
type specRule struct {
	name  string
	re    *regexp.Regexp // nil for a name without placeholders
	value valueForm
}

// Value forms of the rules below.
func text() valueForm { return valueForm{kind: anyText} }

func oneOf(vals ...string) valueForm { return valueForm{kind: enumText, enum: vals} }

func matching(pattern, form string) valueForm {
	return valueForm{kind: patternText, pattern: regexp.MustCompile(`^(?:` + pattern + `)$`), form: form}
}

func whole() valueForm { return valueForm{kind: wholeNumber} }

func atLeast(min int64) valueForm { return valueForm{kind: wholeNumber, min: big.NewInt(min)} }

func between(min, max int64) valueForm {
	return valueForm{kind: wholeNumber, min: big.NewInt(min), max: big.NewInt(max)}
}

func boolean() valueForm { return valueForm{kind: strictBool} }

// cpuListPattern is the form of Nova's vCPU masks and lists.
const cpuListPattern = `\^?\d+((-\d+)?(,\^?\d+(-\d+)?)?)*`

var (
	cpuList   = matching(cpuListPattern, "a vCPU list such as 0-3,^2")
	shares    = oneOf("custom", "high", "normal", "low")
	traitWant = oneOf("required", "forbidden")
)

// standardResourceClasses are the resource classes resources:NAME may give
// besides CUSTOM_*.
var standardResourceClasses = []string{
	"VCPU", "MEMORY_MB", "DISK_GB", "PCI_DEVICE", "SRIOV_NET_VF", "NUMA_SOCKET", "NUMA_CORE",
	"NUMA_THREAD", "NUMA_MEMORY_MB", "IPV4_ADDRESS", "VGPU", "VGPU_DISPLAY_HEAD",
	"NET_BW_EGR_KILOBIT_PER_SEC", "NET_BW_IGR_KILOBIT_PER_SEC", "PCPU", "MEM_ENCRYPTION_CONTEXT",
	"FPGA", "PGPU", "NET_PACKET_RATE_KILOPACKET_PER_SEC", "NET_PACKET_RATE_EGR_KILOPACKET_PER_SEC",
	"NET_PACKET_RATE_IGR_KILOPACKET_PER_SEC",
}

// placeholders are the patterns the {names} in rule names stand for.
var placeholders = map[string]string{
	"{group}":          `([a-zA-Z0-9_-]{1,64})?`,
	"{id}":             `\d+`,
	"{key}":            `.+`,
	"{filter}":         `(:\w+)*`,
	"{name}":           `[A-Z0-9_]+`,
	"{resource_class}": alternatives(standardResourceClasses),
	"{trait}":          alternatives(traitNames()),
}

func alternatives(names []string) string { return "(" + strings.Join(names, "|") + ")" }

func traitNames() []string {
	names := make([]string, 0, len(standardTraits))
	for n := range standardTraits {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func expand(template string) string {
	for ph, pat := range placeholders {
		template = strings.ReplaceAll(template, ph, pat)
	}
	return template
}

// specRules are the extra specs Nova knows, namespace by namespace.
var specRules = func() []specRule {
	var rules []specRule
	add := func(name string, v valueForm) {
		r := specRule{name: name, value: v}
		if strings.Contains(name, "{") {
			r.re = regexp.MustCompile(`^(?:` + expand(name) + `)$`)
		}
		rules = append(rules, r)
	}
	// hw: the guest's CPUs, memory, NUMA topology and devices.
	add("hw:cpu_realtime", boolean())
	add("hw:cpu_realtime_mask", cpuList)
	add("hw:hide_hypervisor_id", boolean())
	add("hw:cpu_policy", oneOf("dedicated", "shared", "mixed"))
	add("hw:cpu_thread_policy", oneOf("prefer", "isolate", "require"))
	add("hw:emulator_threads_policy", oneOf("isolate", "share"))
	add("hw:cpu_dedicated_mask", cpuList)
	add("hw:mem_page_size", matching(`(large|small|any|\d+([kKMGT]i?)?(b|bit|B)?)`,
		"small, large, any or a page size such as 2048, 2MB or 1GiB"))
	add("hw:locked_memory", boolean())
	add("hw:numa_nodes", atLeast(1))
	add("hw:numa_cpus.{id}", cpuList)
	add("hw:numa_mem.{id}", atLeast(1))
	add("hw:pci_numa_affinity_policy", oneOf("required", "preferred", "legacy", "socket"))
	for _, k := range []string{"cpu_sockets", "cpu_cores", "cpu_threads", "max_cpu_sockets", "max_cpu_cores", "max_cpu_threads"} {
		add("hw:"+k, atLeast(1))
	}
	for _, k := range []string{"boot_menu", "vif_multiqueue_enabled", "mem_encryption", "pmu", "ephemeral_encryption"} {
		add("hw:"+k, boolean())
	}
	add("hw:pmem", matching(`([a-zA-Z0-9_]+(,)?)+`, "a comma-separated list of vPMEM labels such as SMALL,4GB"))
	add("hw:serial_port_count", atLeast(0))
	add("hw:tpm_model", oneOf("tpm-tis", "tpm-crb"))
	add("hw:tpm_version", oneOf("1.2", "2.0"))
	add("hw:watchdog_action", oneOf("none", "pause", "poweroff", "reset", "disabled"))
	add("hw:viommu_model", oneOf("intel", "smmuv3", "virtio", "auto"))
	add("hw:ephemeral_encryption_format", oneOf("plain", "luks", "luksv2"))
	add("hw_rng:allowed", boolean())
	add("hw_rng:rate_bytes", atLeast(0))
	add("hw_rng:rate_period", atLeast(0))
	add("hw_video:ram_max_mb", atLeast(0))
	// Keys of no namespace that Nova still checks.
	add("hide_hypervisor_id", boolean())
	add("group_policy", oneOf("isolate", "none"))
	add("os:secure_boot", oneOf("disabled", "required"))
	add("os:resolution", oneOf("1024x768", "1280x1024", "1600x1200", "1920x1200", "2560x1600", "3840x2160"))
	add("os:monitors", between(1, 8))
	add("os:vram", oneOf("64", "128", "256", "512", "1024"))
	add("pci_passthrough:alias", matching(`[^:]+:\d+(?:\s*,\s*[^:]+:\d+)*`, "ALIAS:COUNT[,ALIAS:COUNT...]"))
	add("resources{group}:{resource_class}", whole())
	add("resources{group}:CUSTOM_{name}", whole())
	add("trait{group}:{trait}", traitWant)
	add("trait{group}:CUSTOM_{name}", traitWant)
	add("accel:device_profile", text())
	add("aggregate_instance_extra_specs:{key}", text())
	for _, k := range []string{"id", "uuid", "service_id", "host", "vcpus", "memory_mb", "local_gb", "vcpus_used",
		"memory_mb_used", "local_gb_used", "hypervisor_type", "hypervisor_version", "hypervisor_hostname",
		"free_ram_mb", "free_disk_gb", "current_workload", "running_vms", "disk_available_least", "host_ip",
		"mapped", "cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio", "total_usable_ram_mb",
		"total_usable_disk_gb", "disk_mb_used", "free_disk_mb", "vcpus_total", "num_instances", "num_io_ops",
		"failed_builds", "aggregates", "cell_uuid", "updated"} {
		add("capabilities:"+k, text())
	}
	for _, k := range []string{"cpu_info", "metrics", "stats", "numa_topology", "supported_hv_specs",
		"pci_device_pools", "nodename", "pci_stats", "supported_instances", "limits", "instances"} {
		add("capabilities:"+k+"{filter}", text())
	}
	add("vmware:hw_version", text())
	add("vmware:storage_policy", text())
	// quota: the VMware driver's limits, reservations and shares, then
	// libvirt's tuning.
	for _, r := range []string{"cpu", "memory", "disk_io", "vif"} {
		add("quota:"+r+"_limit", atLeast(0))
		add("quota:"+r+"_reservation", whole())
		add("quota:"+r+"_shares_level", shares)
		add("quota:"+r+"_shares_share", atLeast(0))
	}
	add("quota:cpu_shares", atLeast(0))
	add("quota:cpu_period", atLeast(0))
	add("quota:cpu_quota", whole())
	for _, k := range []string{"disk_read_bytes_sec", "disk_read_iops_sec", "disk_write_bytes_sec", "disk_write_iops_sec",
		"disk_total_bytes_sec", "disk_total_iops_sec", "vif_inbound_average", "vif_inbound_peak",
		"vif_inbound_burst", "vif_outbound_average", "vif_outbound_peak", "vif_outbound_burst"} {
		add("quota:"+k, atLeast(0))
	}
	return rules
}()

var (
	specByName = func() map[string]specRule {
		m := map[string]specRule{}
		for _, r := range specRules {
			if r.re == nil {
				m[r.name] = r
			}
		}
		return m
	}()
	// specNamespaces are the namespaces (the part of a key before its
	// first ":") in which Nova refuses keys it does not know.
	specNamespaces = func() []*regexp.Regexp {
		seen := map[string]bool{}
		var out []*regexp.Regexp
		for _, r := range specRules {
			ns, _, found := strings.Cut(r.name, ":")
			if found && !seen[ns] {
				seen[ns] = true
				out = append(out, regexp.MustCompile(`^(?:`+expand(ns)+`)$`))
			}
		}
		return out
	}()
)

func lookupSpec(key string) (specRule, bool) {
	if r, ok := specByName[key]; ok {
		return r, true
	}
	for _, r := range specRules {
		if r.re != nil && r.re.MatchString(key) {
			return r, true
		}
	}
	return specRule{}, false
}

func knownNamespace(ns string) bool {
	for _, re := range specNamespaces {
		if re.MatchString(ns) {
			return true
		}
	}
	return false
}
