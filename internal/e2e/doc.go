// Package e2e holds pinflow's end-to-end tests: a real redis-server, a real
// Temporal dev server and real worker processes with the simulated
// hypervisor, driven through the pinflow CLI as an operator would.
package e2e
