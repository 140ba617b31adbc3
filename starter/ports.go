package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/pinflow/pinflow/numa"
)

// portFlags are the guest's network ports, one per --port
// name=NAME,physnet=NET,vnic=TYPE[,policy=POLICY][,trusted=BOOL].
type portFlags struct{ ports *[]numa.Port }

func (p portFlags) String() string {
	if p.ports == nil || len(*p.ports) == 0 {
		return ""
	}
	names := make([]string, len(*p.ports))
	for i, port := range *p.ports {
		names[i] = port.Name
	}
	return strings.Join(names, ",")
}

func (p portFlags) Type() string { return "name=N,physnet=P,vnic=T" }

func (p portFlags) Set(s string) error {
	port := numa.Port{VNICType: numa.VNICNormal}
	for _, field := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(field, "=")
		if !ok || v == "" {
			return fmt.Errorf("%q: each field is KEY=VALUE; keys are name, physnet, vnic, policy, trusted", field)
		}
		switch k {
		case "name":
			port.Name = v
		case "physnet":
			port.Physnet = v
		case "vnic":
			port.VNICType = v
		case "policy":
			port.Policy = numa.PCIPolicy(v)
		case "trusted":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("trusted=%q: allowed are true or false", v)
			}
			port.Trusted = &b
		default:
			return fmt.Errorf("%q: unknown key %q; keys are name, physnet, vnic, policy, trusted", field, k)
		}
	}
	if port.Name == "" {
		return fmt.Errorf("%q: a port needs name=NAME", s)
	}
	*p.ports = append(*p.ports, port)
	return nil
}
