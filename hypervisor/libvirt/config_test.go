package libvirt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kelseyhightower/envconfig"

	"github.com/pinflow/pinflow/hypervisor"
	"github.com/pinflow/pinflow/hypervisor/libvirthost"
)

func TestHostMapDecode(t *testing.T) {
	tests := []struct {
		name, in string
		want     HostMap
		wantErr  string
	}{
		{name: "empty", in: "", want: HostMap{}},
		{name: "uris", in: "h1=qemu+unix:///system?socket=/run/h1/libvirt-sock,h2=qemu+tls://h2.example/system",
			want: HostMap{"h1": "qemu+unix:///system?socket=/run/h1/libvirt-sock", "h2": "qemu+tls://h2.example/system"}},
		{name: "cpu lists continue after a comma", in: "h1=0-3,8,h2=1",
			want: HostMap{"h1": "0-3,8", "h2": "1"}},
		{name: "semicolons keep commas and equals in values", in: "h1=qemu+tcp://h1/system?a=1,b=2; h2=0,2",
			want: HostMap{"h1": "qemu+tcp://h1/system?a=1,b=2", "h2": "0,2"}},
		{name: "spaces are trimmed", in: " h1 = tcp://10.0.0.1 , h2=tcp://10.0.0.2 ",
			want: HostMap{"h1": "tcp://10.0.0.1", "h2": "tcp://10.0.0.2"}},
		{name: "no name first", in: "0-3,h1=2", wantErr: `entry "0-3" has no '='`},
		{name: "duplicate", in: "h1=a,h1=b", wantErr: `host "h1" appears twice`},
		{name: "bad name", in: "h 1=a", wantErr: `host name "h 1" has ' '`},
		{name: "empty name", in: "=a", wantErr: "host name is empty"},
		{name: "semicolon entry without equals", in: "h1=a;b", wantErr: `entry "b" has no '='`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got HostMap
			err := got.Decode(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("HostMap.Decode(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("HostMap.Decode(%q) error = %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("HostMap.Decode(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			var back HostMap
			if err := back.Decode(got.String()); err != nil || !cmp.Equal(back, got) {
				t.Errorf("HostMap.Decode(%q.String() = %q) = %v, %v; want %v", tt.in, got.String(), back, err, got)
			}
		})
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("PINFLOW_LIBVIRT_HOSTS", "h1=qemu+tcp://10.0.0.1/system,h2=qemu+tcp://10.0.0.2/system")
	t.Setenv("PINFLOW_LIBVIRT_MIGRATE_URIS", "h2=tcp://10.1.0.2")
	t.Setenv("PINFLOW_LIBVIRT_CPU_DEDICATED_SETS", "h1=2-7,10-15,h2=1")
	t.Setenv("PINFLOW_LIBVIRT_CPU_SHARED_SETS", "h1=0-1")
	t.Setenv("PINFLOW_LIBVIRT_DIAL_TIMEOUT", "3s")
	var cfg Config
	if err := envconfig.Process("pinflow", &cfg); err != nil {
		t.Fatalf("envconfig.Process: %v", err)
	}
	want := Config{
		Hosts:            HostMap{"h1": "qemu+tcp://10.0.0.1/system", "h2": "qemu+tcp://10.0.0.2/system"},
		MigrateURIs:      HostMap{"h2": "tcp://10.1.0.2"},
		CPUDedicatedSets: HostMap{"h1": "2-7,10-15", "h2": "1"},
		CPUSharedSets:    HostMap{"h1": "0-1"},
		DialTimeout:      3 * time.Second,
	}
	if diff := cmp.Diff(want, cfg, cmp.FilterPath(func(p cmp.Path) bool { return p.String() == "Resolve" }, cmp.Ignore())); diff != "" {
		t.Fatalf("envconfig.Process(pinflow) mismatch (-want +got):\n%s", diff)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	got, err := d.HostConfig(context.Background(), "h2")
	wantHC := libvirthost.Config{URI: "qemu+tcp://10.0.0.2/system", MigrateURI: "tcp://10.1.0.2", CPUDedicatedSet: "1"}
	if err != nil || got != wantHC {
		t.Errorf("HostConfig(h2) = %+v, %v; want %+v", got, err, wantHC)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"bad uri", Config{Hosts: HostMap{"h1": "://nope"}}, `host h1: uri "://nope" is invalid`},
		{"no driver", Config{Hosts: HostMap{"h1": "/run/libvirt/libvirt-sock"}}, "has no driver"},
		{"bad transport", Config{Hosts: HostMap{"h1": "qemu+carrier-pigeon://h1/system"}}, `transport "carrier-pigeon" is not supported`},
		{"bad migrate uri", Config{MigrateURIs: HostMap{"h1": "10.0.0.1"}}, `migrate uri "10.0.0.1" is invalid`},
		{"bad dedicated set", Config{CPUDedicatedSets: HostMap{"h1": "3-1"}}, `cpu_dedicated_set "3-1"`},
		{"bad shared set", Config{CPUSharedSets: HostMap{"h1": "x"}}, `cpu_shared_set "x"`},
		{"bad name", Config{Hosts: HostMap{"h/1": "qemu:///system"}}, `host name "h/1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New(%+v) error = %v, want one containing %q", tt.cfg, err, tt.wantErr)
			}
			if !strings.HasPrefix(err.Error(), "libvirt: ") || strings.Contains(err.Error(), "\n") {
				t.Errorf("New(%+v) error %q is not one line starting with \"libvirt: \"", tt.cfg, err)
			}
		})
	}
}

func TestHostResolution(t *testing.T) {
	resolved := map[string]libvirthost.Config{
		"r1": {URI: "qemu+tls://r1.example/system"},
		"h1": {URI: "qemu+tls://shadowed.example/system"},
	}
	d, err := New(Config{
		Hosts:       HostMap{"h1": "qemu+tcp://h1/system", "h2": "qemu+tcp://h2/system"},
		MigrateURIs: HostMap{"r1": "tcp://10.0.0.9", "x1": "tcp://10.0.0.10"},
		Resolve: func(_ context.Context, host string) (libvirthost.Config, error) {
			if hc, ok := resolved[host]; ok {
				return hc, nil
			}
			if host == "broken" {
				return libvirthost.Config{}, errors.New("registry unavailable")
			}
			return libvirthost.Config{}, fmt.Errorf("registry: %s: %w", host, hypervisor.ErrUnknownHost)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Register("x1", "qemu+unix:///system?socket=/tmp/x1.sock"); err != nil {
		t.Fatalf("Register(x1): %v", err)
	}
	if err := d.Register("h2", "qemu+ssh://root@h2/system"); err != nil {
		t.Fatalf("Register(h2): %v", err)
	}
	if err := d.Register("bad", "nodriver"); err == nil {
		t.Errorf("Register(bad, nodriver) = nil, want an error")
	}
	tests := []struct {
		host    string
		want    libvirthost.Config
		wantErr error
	}{
		{host: "h1", want: libvirthost.Config{URI: "qemu+tcp://h1/system"}},
		{host: "h2", want: libvirthost.Config{URI: "qemu+ssh://root@h2/system"}},
		{host: "x1", want: libvirthost.Config{URI: "qemu+unix:///system?socket=/tmp/x1.sock", MigrateURI: "tcp://10.0.0.10"}},
		{host: "r1", want: libvirthost.Config{URI: "qemu+tls://r1.example/system", MigrateURI: "tcp://10.0.0.9"}},
		{host: "nowhere", wantErr: hypervisor.ErrUnknownHost},
		{host: "broken", wantErr: errors.New("registry unavailable")},
	}
	for _, tt := range tests {
		got, err := d.HostConfig(context.Background(), tt.host)
		switch {
		case tt.wantErr == nil && (err != nil || got != tt.want):
			t.Errorf("HostConfig(%s) = %+v, %v; want %+v", tt.host, got, err, tt.want)
		case tt.wantErr != nil && (err == nil || !strings.Contains(err.Error(), tt.host)):
			t.Errorf("HostConfig(%s) error = %v; want one naming the host", tt.host, err)
		case tt.wantErr == hypervisor.ErrUnknownHost && !errors.Is(err, hypervisor.ErrUnknownHost):
			t.Errorf("HostConfig(%s) error = %v; want one wrapping ErrUnknownHost", tt.host, err)
		}
	}
	if got, want := d.Hosts(), []string{"h1", "h2", "x1"}; !cmp.Equal(got, want) {
		t.Errorf("Hosts() = %v, want %v", got, want)
	}
	d.Unregister("x1")
	if _, err := d.HostConfig(context.Background(), "x1"); !errors.Is(err, hypervisor.ErrUnknownHost) {
		t.Errorf("HostConfig(x1) after Unregister: error = %v, want ErrUnknownHost", err)
	}
	// Every driver method names the unknown host and wraps ErrUnknownHost.
	ctx := context.Background()
	calls := map[string]func() error{
		"Capabilities": func() error { _, err := d.Capabilities(ctx, "nowhere"); return err },
		"Define":       func() error { return d.Define(ctx, "nowhere", testDomainXML) },
		"Start":        func() error { return d.Start(ctx, "nowhere", testUUID) },
		"Shutdown":     func() error { return d.Shutdown(ctx, "nowhere", testUUID) },
		"Stop":         func() error { return d.Stop(ctx, "nowhere", testUUID) },
		"Undefine":     func() error { return d.Undefine(ctx, "nowhere", testUUID) },
		"Lookup":       func() error { _, err := d.Lookup(ctx, "nowhere", testUUID); return err },
		"Domains":      func() error { _, err := d.Domains(ctx, "nowhere"); return err },
		"Prepare":      func() error { return d.PrepareMigration(ctx, "nowhere", testUUID, testDomainXML) },
		"Migrate":      func() error { return d.Migrate(ctx, migration("nowhere", "h1", testUUID, testDomainXML), nil) },
		"Rollback":     func() error { return d.Rollback(ctx, "nowhere", "h1", testUUID) },
	}
	for name, f := range calls {
		if err := f(); !errors.Is(err, hypervisor.ErrUnknownHost) || !strings.Contains(err.Error(), "nowhere") {
			t.Errorf("%s(nowhere) error = %v; want one naming the host and wrapping ErrUnknownHost", name, err)
		}
	}
}

const testUUID = "a1b2c3d4-0000-4000-8000-0000000000aa"

const testDomainXML = `<domain type='qemu'><name>t</name><uuid>` + testUUID + `</uuid>
<memory unit='MiB'>128</memory><vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os></domain>`

func TestDialFailureNamesHostAndURI(t *testing.T) {
	sock := t.TempDir() + "/missing.sock"
	d, err := New(Config{Hosts: HostMap{"h1": "qemu+unix:///system?socket=" + sock}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Lookup(context.Background(), "h1", testUUID)
	if err == nil || !strings.Contains(err.Error(), "host h1 (qemu+unix:///system?socket="+sock+")") {
		t.Fatalf("Lookup on a host without a daemon: error = %v; want one naming h1 and its URI", err)
	}
	if errors.Is(err, hypervisor.ErrNotFound) || errors.Is(err, hypervisor.ErrRejected) {
		t.Errorf("Lookup on a host without a daemon: error = %v; want neither ErrNotFound nor ErrRejected", err)
	}
}
