package numa

import "strings"

// Enums of image properties that Nova shares between several of them.
var (
	architectures = []string{"alpha", "armv6", "armv7l", "armv7b", "aarch64", "cris", "i686", "ia64", "lm32",
		"m68k", "microblaze", "microblazeel", "mips", "mipsel", "mips64", "mips64el", "openrisc", "parisc",
		"parisc64", "ppc", "ppcle", "ppc64", "ppc64le", "ppcemb", "s390", "s390x", "sh4", "sh4eb", "sparc",
		"sparc64", "unicore32", "x86_64", "xtensa", "xtensaeb"}
	diskBuses = []string{"fdc", "ide", "sata", "scsi", "usb", "virtio", "xen", "lxc", "uml"}
)

// canonical returns an enum's canonicalizer: lower case, then aliases.
func canonical(aliases map[string]string) func(string) string {
	return func(v string) string {
		v = strings.ToLower(v)
		if a, ok := aliases[v]; ok {
			return a
		}
		return v
	}
}

func canonicalOneOf(aliases map[string]string, vals ...string) valueForm {
	f := oneOf(vals...)
	f.canon = canonical(aliases)
	return f
}

var (
	architecture = canonicalOneOf(map[string]string{"i386": "i686", "i486": "i686", "i586": "i686",
		"x86_32": "i686", "x86_32p": "i686", "amd64": "x86_64"}, architectures...)
	diskBus       = oneOf(diskBuses...)
	flexibleBool  = text() // Nova reads any text as a boolean, false when not true
	novaCPUSpec   = valueForm{kind: testedText, valid: validCPUSpec, form: "a vCPU list such as 0-3,^2"}
	listOnlyValue = valueForm{kind: listOnly}
)

// imagePropRules are the image properties Nova knows, with their forms.
var imagePropRules = map[string]valueForm{
	"hw_architecture":                architecture,
	"hw_auto_disk_config":            text(),
	"hw_boot_menu":                   flexibleBool,
	"hw_cdrom_bus":                   diskBus,
	"hw_cpu_cores":                   whole(),
	"hw_cpu_max_cores":               whole(),
	"hw_cpu_max_sockets":             whole(),
	"hw_cpu_max_threads":             whole(),
	"hw_cpu_policy":                  oneOf("dedicated", "shared", "mixed"),
	"hw_cpu_realtime_mask":           text(),
	"hw_cpu_sockets":                 whole(),
	"hw_cpu_thread_policy":           oneOf("prefer", "isolate", "require"),
	"hw_cpu_threads":                 whole(),
	"hw_device_id":                   whole(),
	"hw_disk_bus":                    diskBus,
	"hw_disk_type":                   text(),
	"hw_emulation_architecture":      architecture,
	"hw_ephemeral_encryption":        flexibleBool,
	"hw_ephemeral_encryption_format": oneOf("plain", "luks", "luksv2"),
	"hw_firmware_type":               oneOf("uefi", "bios"),
	"hw_floppy_bus":                  diskBus,
	"hw_input_bus":                   oneOf("usb", "virtio"),
	"hw_ipxe_boot":                   flexibleBool,
	"hw_locked_memory":               flexibleBool,
	"hw_machine_type":                text(),
	"hw_mem_encryption":              flexibleBool,
	"hw_mem_page_size":               text(),
	// Nova reads the cells' lists from hw_numa_cpus.N and hw_numa_mem.N
	// and ignores these two names given as they are.
	"hw_numa_cpus":                text(),
	"hw_numa_mem":                 text(),
	"hw_numa_nodes":               whole(),
	"hw_pci_numa_affinity_policy": oneOf("required", "legacy", "preferred", "socket"),
	"hw_pmu":                      flexibleBool,
	"hw_pointer_model":            oneOf("usbtablet"),
	"hw_qemu_guest_agent":         flexibleBool,
	"hw_rescue_bus":               diskBus,
	"hw_rescue_device":            oneOf("cdrom", "disk", "floppy", "fs", "lun"),
	"hw_rng_model":                oneOf("virtio"),
	"hw_scsi_model": canonicalOneOf(map[string]string{"lsilogicsas": "lsisas1068", "paravirtual": "vmpvscsi"},
		"buslogic", "ibmvscsi", "lsilogic", "lsisas1068", "lsisas1078", "virtio-scsi", "vmpvscsi"),
	"hw_serial_port_count": whole(),
	"hw_time_hpet":         flexibleBool,
	"hw_tpm_model":         oneOf("tpm-tis", "tpm-crb"),
	"hw_tpm_version":       oneOf("1.2", "2.0"),
	"hw_video_model":       oneOf("cirrus", "qxl", "vga", "vmvga", "xen", "virtio", "gop", "none", "bochs"),
	"hw_video_ram":         whole(),
	"hw_vif_model": canonicalOneOf(map[string]string{"virtuale1000": "e1000", "virtuale1000e": "e1000e",
		"virtualpcnet32": "pcnet", "virtualsriovethernetcard": "sriov", "virtualvmxnet": "vmxnet",
		"virtualvmxnet3": "vmxnet3"},
		"virtio", "ne2k_pci", "pcnet", "rtl8139", "e1000", "e1000e", "netfront", "spapr-vlan", "lan9118",
		"sriov", "vmxnet", "vmxnet3"),
	"hw_vif_multiqueue_enabled": flexibleBool,
	"hw_viommu_model":           oneOf("intel", "smmuv3", "virtio", "auto"),
	"hw_vm_mode": canonicalOneOf(map[string]string{"pv": "xen", "hv": "hvm", "baremetal": "hvm"},
		"hvm", "xen", "uml", "exe"),
	"hw_watchdog_action":       oneOf("none", "pause", "poweroff", "reset", "disabled"),
	"img_bdm_v2":               flexibleBool,
	"img_bittorrent":           flexibleBool,
	"img_block_device_mapping": listOnlyValue,
	"img_cache_in_nova":        flexibleBool,
	"img_compression_level":    whole(),
	"img_config_drive":         oneOf("optional", "mandatory"),
	"img_hide_hypervisor_id":   flexibleBool,
	"img_hv_requested_version": matching(versionPredicates,
		"comparisons such as >=6.2 or >=1.0, <2.0 (an operator and a version of two or three numbers)"),
	"img_hv_type": canonicalOneOf(map[string]string{"xapi": "xen"},
		"baremetal", "bhyve", "docker", "fake", "hyperv", "ironic", "kqemu", "kvm", "lxc", "lxd", "openvz",
		"parallels", "phyp", "qemu", "test", "uml", "vbox", "vz", "vmware", "xen", "zvm", "prsm"),
	"img_linked_clone":               flexibleBool,
	"img_mappings":                   listOnlyValue,
	"img_owner_id":                   text(),
	"img_root_device_name":           text(),
	"img_signature":                  text(),
	"img_signature_certificate_uuid": text(), // Nova warns of a bad UUID but takes it
	"img_signature_hash_method":      oneOf("SHA-224", "SHA-256", "SHA-384", "SHA-512"),
	"img_signature_key_type": oneOf("DSA", "ECC_SECP384R1", "ECC_SECP521R1", "ECC_SECT409K1", "ECC_SECT409R1",
		"ECC_SECT571K1", "ECC_SECT571R1", "RSA-PSS"),
	"img_use_agent":                      flexibleBool,
	"img_version":                        whole(),
	"os_admin_user":                      text(),
	"os_command_line":                    text(),
	"os_distro":                          text(),
	"os_require_quiesce":                 flexibleBool,
	"os_secure_boot":                     oneOf("required", "disabled", "optional"),
	"os_skip_agent_inject_files_at_boot": flexibleBool,
	"os_skip_agent_inject_ssh":           flexibleBool,
	"os_type":                            canonicalOneOf(nil, "linux", "windows"),
	// Nova fills traits_required from trait:NAME=required only.
	"traits_required": text(),
}

// legacyImageProps maps the old names Nova still reads to the properties
// they set.
var legacyImageProps = map[string]string{
	"architecture":                           "hw_architecture",
	"owner_id":                               "img_owner_id",
	"vmware_disktype":                        "hw_disk_type",
	"vmware_image_version":                   "img_version",
	"vmware_ostype":                          "os_distro",
	"auto_disk_config":                       "hw_auto_disk_config",
	"ipxe_boot":                              "hw_ipxe_boot",
	"xenapi_device_id":                       "hw_device_id",
	"xenapi_image_compression_level":         "img_compression_level",
	"vmware_linked_clone":                    "img_linked_clone",
	"xenapi_use_agent":                       "img_use_agent",
	"xenapi_skip_agent_inject_ssh":           "os_skip_agent_inject_ssh",
	"xenapi_skip_agent_inject_files_at_boot": "os_skip_agent_inject_files_at_boot",
	"cache_in_nova":                          "img_cache_in_nova",
	"vm_mode":                                "hw_vm_mode",
	"bittorrent":                             "img_bittorrent",
	"mappings":                               "img_mappings",
	"block_device_mapping":                   "img_block_device_mapping",
	"bdm_v2":                                 "img_bdm_v2",
	"root_device_name":                       "img_root_device_name",
	"hypervisor_version_requires":            "img_hv_requested_version",
	"hypervisor_type":                        "img_hv_type",
}

// versionPredicates is the form of a hypervisor version requirement: one
// or more comparisons of a version of two or three numbers, with an
// optional alpha or beta suffix.
const versionPredicates = `\s*(<=|>=|<|>|!=|==)\s*[0-9]+\.[0-9]+(\.[0-9]+)?([ab][0-9]+)?\s*` +
	`(,\s*(<=|>=|<|>|!=|==)\s*[0-9]+\.[0-9]+(\.[0-9]+)?([ab][0-9]+)?\s*)*`

// validCPUSpec reports whether s is a vCPU list as Nova parses one: comma
// separated ids, ranges "a-b" with a <= b, and exclusions "^id" or
// "^a-b"; blanks around parts and empty parts are allowed. Ids have no
// bound here; the request built from the list bounds them.
func validCPUSpec(s string) bool {
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if first, second, isRange := strings.Cut(part, "-"); isRange {
			first = strings.TrimPrefix(first, "^")
			lo, ok1 := pythonInt(first)
			hi, ok2 := pythonInt(second)
			if !ok1 || !ok2 || lo.Cmp(hi) > 0 {
				return false
			}
			continue
		}
		if _, ok := pythonInt(strings.TrimPrefix(part, "^")); !ok {
			return false
		}
	}
	return true
}
