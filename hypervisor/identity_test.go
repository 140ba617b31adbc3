package hypervisor

import (
	"errors"
	"strings"
	"testing"
)

func TestReadDomainIdentity(t *testing.T) {
	const u = "0f8fad5b-d9cb-469f-a165-70867728950e"
	got, err := ReadDomainIdentity("<domain><name> a </name><uuid>" + strings.ToUpper(strings.ReplaceAll(u, "-", "")) + "</uuid><memory unit='MiB'>512</memory></domain>")
	if err != nil || got != (DomainIdentity{Name: "a", UUID: u, MemoryBytes: 512 << 20}) {
		t.Errorf("ReadDomainIdentity(a) = %+v, %v; want name a, uuid %s, 512 MiB", got, err, u)
	}
	rejected := []struct {
		name, xml, wantIn string
	}{
		{"not xml", "<domain", "does not parse"},
		{"no uuid", "<domain><name>a</name></domain>", "no <uuid>"},
		{"short uuid", "<domain><name>a</name><uuid>1234</uuid></domain>", `uuid "1234" is invalid; want 32 hex digits`},
		{"no name", "<domain><uuid>" + u + "</uuid></domain>", "<name>"},
	}
	for _, tt := range rejected {
		_, err := ReadDomainIdentity(tt.xml)
		if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), tt.wantIn) {
			t.Errorf("ReadDomainIdentity(%s) = %v; want ErrRejected containing %q", tt.name, err, tt.wantIn)
		}
	}
}

func TestReadDomainIdentityMemory(t *testing.T) {
	tests := []struct {
		unit, value string
		want        uint64
	}{
		{"", "1024", 1 << 20},
		{"KiB", "1024", 1 << 20},
		{"MiB", "512", 512 << 20},
		{"GiB", "2", 2 << 30},
		{"MB", "1", 1000000},
		{"bytes", "7", 7},
		{"MiB", "lots", 0},
	}
	for _, tt := range tests {
		doc := "<domain><name>a</name><uuid>0f8fad5b-d9cb-469f-a165-70867728950e</uuid><memory unit='" + tt.unit + "'>" + tt.value + "</memory></domain>"
		id, err := ReadDomainIdentity(doc)
		if err != nil || id.MemoryBytes != tt.want {
			t.Errorf("ReadDomainIdentity(<memory unit=%q>%s).MemoryBytes = %d, %v; want %d", tt.unit, tt.value, id.MemoryBytes, err, tt.want)
		}
	}
}
