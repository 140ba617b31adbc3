package ledger

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

// pinSet is what a host's pins hash holds: pinned pCPUs, keyed by their
// id, and held PCI devices, keyed by their address. Both are pins alike to
// the scripts, which take and free them in one step: a claim gets its
// pCPUs and its devices together or none of them.
type pinSet struct {
	cpus []int
	devs []string
}

var devicePin = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// isDevicePin reports whether a pin key is a PCI address.
func isDevicePin(key string) bool { return devicePin.MatchString(key) }

// pinsOf sorts pin keys into pCPUs and devices, leaving out anything that
// is neither.
func pinsOf(keys []string) pinSet {
	var p pinSet
	for _, k := range keys {
		p.add(k)
	}
	return p
}

func (p *pinSet) add(key string) {
	if id, err := strconv.Atoi(key); err == nil {
		if id >= 0 && id <= numa.MaxCPU {
			p.cpus = append(p.cpus, id)
		}
		return
	}
	if isDevicePin(key) {
		p.devs = append(p.devs, key)
	}
}

// parsePins parses a script's comma-separated pins.
func parsePins(s string) pinSet {
	var p pinSet
	for s != "" {
		var item string
		item, s, _ = strings.Cut(s, ",")
		p.add(item)
	}
	return p
}

// freeDevices pools topo's devices that p does not hold.
func (p pinSet) freeDevices(topo *numa.Host) []numa.DevicePool {
	if len(topo.PCIDevices) == 0 {
		return nil
	}
	held := make(map[string]bool, len(p.devs))
	for _, a := range p.devs {
		held[a] = true
	}
	return topo.FreeDevicePools(func(a string) bool { return held[a] })
}
