// Package numa decides where a guest's vCPUs, memory and huge pages go on a
// NUMA host, with OpenStack Nova's knobs and answers but not its cost.
//
// A Host is a hypervisor's NUMA cells with their current usage. A Request is
// what a flavor and an image ask for, built by NewRequest under Nova's names
// (hw:cpu_policy, hw:numa_nodes, hw:mem_page_size, ...) and conflict rules;
// an invalid combination is an *InvalidRequestError. Fit places a Request on
// a Host and returns a Placement: per guest cell its host cell, vCPU to pCPU
// pins, reserved emulator pCPUs, page size and memory. When nothing fits it
// returns a *NoFitError that says which guest cell could not go where, and
// why. Usage says exactly which pCPUs, MiB and pages a Placement consumes, so
// a ledger adds and removes it without deriving anything again.
//
// A Host may also have PCI device pools (type-PCI, SR-IOV PFs and VFs, vDPA)
// and cells that NICs of physical or tunneled networks hang off; a Request
// may ask for devices (PCIRequest) under hw:pci_numa_affinity_policy and for
// NUMA affinity to its networks (AddDevices). Fit then also needs host cells
// that together supply the devices and reach the networks, as Nova checks
// each assignment, and Placement.Devices says which pools the devices come
// from.
//
// Fit agrees with Nova's numa_fit_instance_to_host on whether a request fits
// and on which host cell each guest cell gets, but it matches guest cells to
// host cells as a bipartite matching instead of walking every permutation of
// host cells, and it has none of Nova's fit-cache and page-size mutation
// bugs. Where Nova's answer is wrong, Fit gives the right one; the tests list
// each such case.
package numa
