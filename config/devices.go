package config

import (
	"fmt"

	"github.com/pinflow/pinflow/numa"
)

// Devices is how guests ask for PCI devices.
type Devices struct {
	// PCIAlias names the PCI devices flavors ask for with
	// pci_passthrough:alias=NAME:COUNT: a JSON array of aliases as Nova's
	// [pci] alias, e.g. [{"name": "nic", "vendor_id": "8086", "product_id":
	// "154c", "device_type": "type-VF", "numa_policy": "required"}]. Entries
	// of one name are alternatives. The CLI resolves a flavor's aliases
	// when the guest boots or resizes; the guest keeps what they meant then.
	PCIAlias string `envconfig:"PCI_ALIAS"`
}

// PCIAliases are the configured aliases; none when PINFLOW_PCI_ALIAS is
// empty.
func (d Devices) PCIAliases() (numa.PCIAliases, error) {
	if d.PCIAlias == "" {
		return nil, nil
	}
	a, err := numa.ParsePCIAliases([]byte(d.PCIAlias))
	if err != nil {
		return nil, fmt.Errorf("config: %s_PCI_ALIAS: %v", Prefix, err)
	}
	return a, nil
}
