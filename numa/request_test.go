package numa

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestNewRequestInvalid checks the kind NewRequest gives each refusal:
// ValidationError and InvalidRequest are the API's validation of extra
// specs and image properties, the others Nova's request building.
func TestNewRequestInvalid(t *testing.T) {
	tests := []struct {
		name   string
		vcpus  int
		flavor map[string]string
		image  map[string]string
		kind   string
	}{
		{"thread policy without pinning", 2, map[string]string{"hw:cpu_thread_policy": "isolate"}, nil, "CPUThreadPolicyConfigurationInvalid"},
		{"emulator isolate without pinning", 2, map[string]string{"hw:emulator_threads_policy": "isolate"}, nil, "BadRequirementEmulatorThreadsPolicy"},
		{"bad cpu policy", 2, map[string]string{"hw:cpu_policy": "pinned"}, nil, "ValidationError"},
		{"bad image cpu policy", 2, nil, map[string]string{"hw_cpu_policy": "x"}, "InvalidRequest"},
		{"image dedicated under shared flavor", 2, map[string]string{"hw:cpu_policy": "shared"}, map[string]string{"hw_cpu_policy": "dedicated"}, "ImageCPUPinningForbidden"},
		{"image dedicated under mixed flavor", 2, map[string]string{"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "1"}, map[string]string{"hw_cpu_policy": "dedicated"}, "ImageCPUPinningForbidden"},
		{"thread policy conflict", 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "isolate"}, map[string]string{"hw_cpu_thread_policy": "require"}, "ImageCPUThreadPolicyForbidden"},
		{"bad emulator policy", 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:emulator_threads_policy": "both"}, nil, "ValidationError"},
		{"mixed without mask", 2, map[string]string{"hw:cpu_policy": "mixed"}, nil, "RequiredMixedOrRealtimeCPUMask"},
		{"mixed with both masks", 4, map[string]string{"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0"}, nil, "RequiredMixedOrRealtimeCPUMask"},
		{"dedicated mask without mixed", 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_dedicated_mask": "1"}, nil, "RequiredMixedInstancePolicy"},
		{"mask leaves no shared vCPU", 2, map[string]string{"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "0-1"}, nil, "InvalidMixedInstanceDedicatedMask"},
		{"mask outside vCPUs", 2, map[string]string{"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "1,5"}, nil, "InvalidMixedInstanceDedicatedMask"},
		{"realtime without pinning", 2, map[string]string{"hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "^0"}, nil, "RealtimeConfigurationInvalid"},
		{"realtime on all vCPUs without emulator policy", 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_realtime": "yes"}, nil, "RealtimeMaskNotFoundOrInvalid"},
		{"realtime mask outside vCPUs", 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "7"}, nil, "RealtimeMaskNotFoundOrInvalid"},
		{"numa nodes zero", 2, map[string]string{"hw:numa_nodes": "0"}, nil, "ValidationError"},
		{"numa nodes not a number", 2, map[string]string{"hw:numa_nodes": "two"}, nil, "ValidationError"},
		{"numa nodes in flavor and image", 2, map[string]string{"hw:numa_nodes": "1"}, map[string]string{"hw_numa_nodes": "1"}, "ImageNUMATopologyForbidden"},
		{"asymmetric split", 3, map[string]string{"hw:numa_nodes": "2"}, nil, "ImageNUMATopologyAsymmetric"},
		{"cpus without mem", 2, map[string]string{"hw:numa_nodes": "1", "hw:numa_cpus.0": "0-1"}, nil, "ImageNUMATopologyIncomplete"},
		{"too few cells", 2, map[string]string{"hw:numa_nodes": "2", "hw:numa_cpus.0": "0-1", "hw:numa_mem.0": "1024"}, nil, "ImageNUMATopologyIncomplete"},
		{"vCPU out of range", 2, map[string]string{"hw:numa_nodes": "1", "hw:numa_cpus.0": "0-2", "hw:numa_mem.0": "1024"}, nil, "ImageNUMATopologyCPUOutOfRange"},
		{"vCPU twice", 2, map[string]string{"hw:numa_nodes": "2", "hw:numa_cpus.0": "0-1", "hw:numa_mem.0": "512", "hw:numa_cpus.1": "1", "hw:numa_mem.1": "512"}, nil, "ImageNUMATopologyCPUDuplicates"},
		{"vCPU unassigned", 3, map[string]string{"hw:numa_nodes": "1", "hw:numa_cpus.0": "0-1", "hw:numa_mem.0": "1024"}, nil, "ImageNUMATopologyCPUsUnassigned"},
		{"memory does not add up", 2, map[string]string{"hw:numa_nodes": "1", "hw:numa_cpus.0": "0-1", "hw:numa_mem.0": "512"}, nil, "ImageNUMATopologyMemoryOutOfRange"},
		{"bad page size", 2, map[string]string{"hw:mem_page_size": "huge"}, nil, "ValidationError"},
		{"image page size alone", 2, nil, map[string]string{"hw_mem_page_size": "2048"}, "MemoryPageSizeForbidden"},
		{"image page size under explicit flavor size", 2, map[string]string{"hw:mem_page_size": "2048"}, map[string]string{"hw_mem_page_size": "1GB"}, "MemoryPageSizeForbidden"},
		{"locked memory without pages", 2, map[string]string{"hw:locked_memory": "true"}, nil, "LockMemoryForbidden"},
		{"PCPU with cpu policy", 2, map[string]string{"resources:PCPU": "2", "hw:cpu_policy": "dedicated"}, nil, "InvalidRequest"},
		{"PCPU count wrong", 2, map[string]string{"resources:PCPU": "3"}, nil, "InvalidRequest"},
		{"SMT trait with thread policy", 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "isolate", "trait:HW_CPU_HYPERTHREADING": "forbidden"}, nil, "InvalidRequest"},
		{"zero vCPUs", 0, nil, nil, "InvalidVCPUs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := NewRequest(tt.vcpus, 1024, tt.flavor, tt.image)
			var inv *InvalidRequestError
			if !errors.As(err, &inv) {
				t.Fatalf("NewRequest(%d, %v, %v) = %+v, %v; want an InvalidRequestError %s", tt.vcpus, tt.flavor, tt.image, req, err, tt.kind)
			}
			if inv.Kind != tt.kind {
				t.Errorf("NewRequest(%v, %v) kind = %s, want %s (%s)", tt.flavor, tt.image, inv.Kind, tt.kind, inv.Message)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is not one line", err)
			}
		})
	}
}

func TestNewRequestTopology(t *testing.T) {
	tests := []struct {
		name   string
		vcpus  int
		flavor map[string]string
		image  map[string]string
		want   string // per cell: shared|dedicated|memory|pagesize|policy|threads
	}{
		{"shared has no NUMA", 2, nil, nil, ""},
		{"dedicated one cell", 4, map[string]string{"hw:cpu_policy": "dedicated"}, nil, "|0-3|1024||dedicated|"},
		{"image dedicated", 2, nil, map[string]string{"hw_cpu_policy": "dedicated"}, "|0-1|1024||dedicated|"},
		{"two nodes", 4, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2"}, nil, "|0-1|512||dedicated|;|2-3|512||dedicated|"},
		{"mixed mask", 4, map[string]string{"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0-1"}, nil, "0-1|2-3|1024||mixed|"},
		{"mixed realtime mask", 4, map[string]string{"hw:cpu_policy": "mixed", "hw:cpu_realtime": "yes", "hw:cpu_realtime_mask": "2-3"}, nil, "0-1|2-3|1024||mixed|"},
		{"large pages force NUMA", 2, map[string]string{"hw:mem_page_size": "large"}, nil, "0-1||1024|large||"},
		{"image refines any", 2, map[string]string{"hw:mem_page_size": "any"}, map[string]string{"hw_mem_page_size": "1GB"}, "0-1||1024|1048576||"},
		{"unit page size", 2, map[string]string{"hw:mem_page_size": "2MB"}, nil, "0-1||1024|2048||"},
		{"manual cells", 3, map[string]string{"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2", "hw:numa_cpus.0": "0", "hw:numa_mem.0": "256", "hw:numa_cpus.1": "1-2", "hw:numa_mem.1": "768"}, nil, "|0|256||dedicated|;|1-2|768||dedicated|"},
		{"image manual cells", 2, nil, map[string]string{"hw_numa_nodes": "2", "hw_numa_cpus.0": "0", "hw_numa_mem.0": "512", "hw_numa_cpus.1": "1", "hw_numa_mem.1": "512"}, "0||512|||;1||512|||"},
		{"PCPU resources imply dedicated", 2, map[string]string{"resources:PCPU": "2"}, nil, "|0-1|1024||dedicated|"},
		{"SMT trait forbidden is isolate", 2, map[string]string{"hw:cpu_policy": "dedicated", "trait:HW_CPU_HYPERTHREADING": "forbidden"}, nil, "|0-1|1024||dedicated|isolate"},
		{"flavor prefer wins over image", 2, map[string]string{"hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "prefer"}, map[string]string{"hw_cpu_thread_policy": "isolate"}, "|0-1|1024||dedicated|prefer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := NewRequest(tt.vcpus, 1024, tt.flavor, tt.image)
			if err != nil {
				t.Fatalf("NewRequest(%v, %v): %v", tt.flavor, tt.image, err)
			}
			var cells []string
			for _, c := range req.Cells {
				cells = append(cells, strings.Join([]string{c.SharedVCPUs.String(), c.DedicatedVCPUs.String(),
					strconv.FormatInt(c.MemoryMB, 10), c.PageSize.String(), string(c.CPUPolicy), string(c.ThreadPolicy)}, "|"))
			}
			if got := strings.Join(cells, ";"); got != tt.want {
				t.Errorf("NewRequest(%v, %v) cells = %q, want %q", tt.flavor, tt.image, got, tt.want)
			}
		})
	}
}
