package config

import (
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// frontendScheme names the resolver that hands the client every frontend
// of a Temporal cluster when TEMPORAL_ADDRESS lists several.
const frontendScheme = "pinflow-frontends"

// frontends are the host:port addresses TEMPORAL_ADDRESS lists, one or
// several comma-separated, each checked.
func (t Temporal) frontends() ([]string, error) {
	var addrs []string
	for _, a := range strings.Split(t.Address, ",") {
		a = strings.TrimSpace(a)
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, fmt.Errorf("config: %s_TEMPORAL_ADDRESS %q: %q is not host:port; give one frontend or several, comma-separated", Prefix, t.Address, a)
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}

// dialTarget is the client's HostPort and the dial options that reach
// the frontends: one address is dialled as is; several are the frontends
// of one cluster, which a manual resolver gives gRPC together, so calls
// spread round-robin (the SDK's service config) over the connections
// that are up and the loss of one frontend stops nothing.
func (t Temporal) dialTarget() (string, []grpc.DialOption, error) {
	addrs, err := t.frontends()
	if err != nil {
		return "", nil, err
	}
	if len(addrs) == 1 {
		return addrs[0], nil, nil
	}
	r := manual.NewBuilderWithScheme(frontendScheme)
	state := resolver.State{}
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(state)
	return frontendScheme + ":///temporal", []grpc.DialOption{grpc.WithResolvers(r)}, nil
}

// serverName is the name a TLS connection checks: the configured one, or
// the first frontend's host, since a resolver's target names no host.
func (t Temporal) serverName() string {
	if t.TLSServerName != "" {
		return t.TLSServerName
	}
	addrs, err := t.frontends()
	if err != nil || len(addrs) < 2 {
		return ""
	}
	host, _, _ := net.SplitHostPort(addrs[0])
	return host
}
