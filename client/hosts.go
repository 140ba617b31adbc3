package client

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/pinflow/pinflow/ledger"
)

// HostStatus is the state of a registered host; an unknown one is
// refused naming a few registered hosts.
func (c *Client) HostStatus(ctx context.Context, host string) (ledger.HostStatus, error) {
	st, err := c.led.HostStatus(ctx, host)
	if errors.Is(err, ledger.ErrUnknownHost) {
		return st, c.unknownHost(ctx, host)
	}
	return st, err
}

// unknownHost refuses host, naming the registered hosts when they are
// few enough to read in one line.
func (c *Client) unknownHost(ctx context.Context, host string) error {
	hosts, err := c.led.Hosts(ctx)
	if err != nil {
		return err
	}
	sort.Strings(hosts)
	switch {
	case len(hosts) == 0:
		return fmt.Errorf("unknown host %q; no host is registered: %w", host, ErrUnknownHost)
	case len(hosts) > maxListed:
		return fmt.Errorf("unknown host %q; %d hosts are registered, none of that name: %w", host, len(hosts), ErrUnknownHost)
	}
	return fmt.Errorf("unknown host %q; registered hosts are %s: %w", host, strings.Join(hosts, ", "), ErrUnknownHost)
}

// checkTarget refuses a host that is unknown or takes no guests now. A
// disabled host takes the guests an operator sends it by name; Notify
// says so.
func (c *Client) checkTarget(ctx context.Context, host string) error {
	st, err := c.HostStatus(ctx, host)
	if err != nil {
		return err
	}
	if st.State == ledger.HostDisabled {
		c.notify(fmt.Sprintf("host %s is disabled (%s); it takes this guest because it was named", host, st.Reason))
		return nil
	}
	if st.State != ledger.HostUp {
		return fmt.Errorf("host %s is %s (%s) and takes no guests until it is back up: %w", host, st.State, st.Reason, ErrHostDown)
	}
	return nil
}

// notify passes a note that does not stop a request to Notify.
func (c *Client) notify(note string) {
	if c.Notify != nil {
		c.Notify(note)
	}
}
