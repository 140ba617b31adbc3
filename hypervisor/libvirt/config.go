package libvirt

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/pinflow/pinflow/hypervisor/libvirthost"
)

// Config configures the driver. Process it with
// envconfig.Process("pinflow", &cfg) to read PINFLOW_LIBVIRT_HOSTS and the
// other variables named in the tags.
type Config struct {
	// Hosts maps pinflow host names to libvirt URIs, such as
	// "h1=qemu+tls://h1.example/system,h2=qemu+unix:///system?socket=/run/h2.sock".
	Hosts HostMap `envconfig:"LIBVIRT_HOSTS"`
	// MigrateURIs maps host names to the migrate_uri a live migration to
	// that host sends guest memory to, such as "h2=tcp://10.0.0.2". Its
	// host part is also the address the destination QEMU listens on. A
	// host without one lets libvirt use the destination's hostname.
	MigrateURIs HostMap `envconfig:"LIBVIRT_MIGRATE_URIS"`
	// CPUDedicatedSets maps host names to their cpu_dedicated_set, the
	// host CPUs guests may be pinned to, such as "h1=2-7,10-15".
	CPUDedicatedSets HostMap `envconfig:"LIBVIRT_CPU_DEDICATED_SETS"`
	// CPUSharedSets maps host names to their cpu_shared_set, the host CPUs
	// for floating vCPUs and shared emulator threads, such as "h1=0-1".
	CPUSharedSets HostMap `envconfig:"LIBVIRT_CPU_SHARED_SETS"`
	// DialTimeout bounds connecting to one libvirtd.
	DialTimeout time.Duration `envconfig:"LIBVIRT_DIAL_TIMEOUT"`
	// ProgressInterval is how often a running migration's job statistics
	// are read and reported.
	ProgressInterval time.Duration `envconfig:"LIBVIRT_PROGRESS_INTERVAL"`
	// AbortTimeout bounds how long a cancelled migration may take to end
	// after libvirt was asked to abort it.
	AbortTimeout time.Duration `envconfig:"LIBVIRT_ABORT_TIMEOUT"`
	// PostCopyStallTimeout bounds how long a migration in post-copy, or
	// the resume of one, may send no data: it is then paused
	// (VIR_DOMAIN_ABORT_JOB_POSTCOPY) and resumed, as after a broken
	// connection, since the guest runs on the destination and waits for
	// every page it has not received.
	PostCopyStallTimeout time.Duration `envconfig:"LIBVIRT_POSTCOPY_STALL_TIMEOUT"`

	// Resolve, when set, is asked for hosts that are neither registered
	// nor in Hosts, so that a registry kept elsewhere (the ledger, say)
	// can name them. It returns an error wrapping
	// hypervisor.ErrUnknownHost for a host it does not know.
	Resolve func(ctx context.Context, host string) (libvirthost.Config, error) `ignored:"true"`
}

// Defaults for the Config durations left zero.
const (
	DefaultDialTimeout      = 15 * time.Second
	DefaultProgressInterval = 500 * time.Millisecond
	DefaultAbortTimeout     = 2 * time.Minute
	DefaultPostCopyStall    = time.Minute
)

// redactURI hides a password a URI may carry before it goes into an error.
func redactURI(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	return u.Redacted()
}

// HostMap maps host names to values. From the environment it reads
// "NAME=VALUE" entries. When the text holds a ";", entries are separated by
// ";" alone, so values may contain "," and "=". Otherwise they are
// separated by ",", and a piece without "=" continues the previous value,
// so CPU lists need no quoting: "h1=0-3,8,h2=1" is h1 → "0-3,8" and h2 → "1".
type HostMap map[string]string

// Decode parses the environment form; envconfig calls it.
func (m *HostMap) Decode(value string) error {
	out := HostMap{}
	add := func(name, v string) error {
		name = strings.TrimSpace(name)
		if err := checkHostName(name); err != nil {
			return err
		}
		if _, dup := out[name]; dup {
			return fmt.Errorf("libvirt: host %q appears twice in %q; give each host once", name, value)
		}
		out[name] = strings.TrimSpace(v)
		return nil
	}
	if strings.Contains(value, ";") {
		for _, entry := range strings.Split(value, ";") {
			if strings.TrimSpace(entry) == "" {
				continue
			}
			name, v, ok := strings.Cut(entry, "=")
			if !ok {
				return fmt.Errorf("libvirt: host map entry %q has no '='; want NAME=VALUE entries separated by ';'", strings.TrimSpace(entry))
			}
			if err := add(name, v); err != nil {
				return err
			}
		}
		*m = out
		return nil
	}
	last := ""
	for _, piece := range strings.Split(value, ",") {
		piece = strings.TrimSpace(piece)
		name, v, ok := strings.Cut(piece, "=")
		switch {
		case ok:
			if err := add(name, v); err != nil {
				return err
			}
			last = strings.TrimSpace(name)
		case piece == "":
		case last == "":
			return fmt.Errorf("libvirt: host map entry %q has no '='; want NAME=VALUE entries separated by ','", piece)
		default:
			out[last] += "," + piece
		}
	}
	*m = out
	return nil
}

// String returns the map in the form Decode reads, sorted by host name,
// with ";" between entries so values with "," read back unchanged.
func (m HostMap) String() string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString(";")
		}
		b.WriteString(n + "=" + m[n])
	}
	return b.String()
}

// checkHostName rejects names that cannot be pinflow host names.
func checkHostName(name string) error {
	if name == "" {
		return fmt.Errorf("libvirt: host name is empty; want letters, digits, '.', '_' or '-'")
	}
	for _, r := range name {
		ok := r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !ok {
			return fmt.Errorf("libvirt: host name %q has %q; want letters, digits, '.', '_' or '-'", name, r)
		}
	}
	return nil
}
