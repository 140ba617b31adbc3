package config

import (
	"context"
	"net"
	"strings"
	"testing"

	"go.temporal.io/api/workflowservice/v1"

	"github.com/pinflow/pinflow/internal/testenv"
)

// TestFrontendsRefusesBadAddresses: every entry of TEMPORAL_ADDRESS must
// be host:port, and the error names the bad entry.
func TestFrontendsRefusesBadAddresses(t *testing.T) {
	for _, addr := range []string{"", "127.0.0.1", "127.0.0.1:7233,", "127.0.0.1:7233,frontend-b", "a:1, b"} {
		_, err := Temporal{Address: addr}.frontends()
		if err == nil || !strings.Contains(err.Error(), "PINFLOW_TEMPORAL_ADDRESS") || !strings.Contains(err.Error(), "not host:port") {
			t.Errorf("frontends(%q) = %v; want an error naming PINFLOW_TEMPORAL_ADDRESS and the bad entry", addr, err)
		}
	}
	got, err := Temporal{Address: "10.0.0.1:7233, 10.0.0.2:7233"}.frontends()
	if err != nil || len(got) != 2 || got[1] != "10.0.0.2:7233" {
		t.Fatalf("frontends(two) = %v, %v; want both addresses, trimmed", got, err)
	}
}

// TestDialSeveralFrontendsSurvivesADeadOne dials a list whose first
// frontend refuses every connection and whose second is a real server:
// the client connects, and every call of a burst succeeds through the
// live one.
func TestDialSeveralFrontendsSurvivesADeadOne(t *testing.T) {
	ts := testenv.StartTemporal(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close() // nothing listens there now: connections are refused

	c := Config{}
	c.Address, c.Namespace = deadAddr+","+ts.Address, ts.Namespace
	ctx := context.Background()
	tc, err := c.Dial(ctx, nil)
	if err != nil {
		t.Fatalf("Dial(%s): %v", c.Address, err)
	}
	defer tc.Close()
	for i := 0; i < 20; i++ {
		_, err := tc.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: ts.Namespace})
		if err != nil {
			t.Fatalf("call %d through %s: %v", i, c.Address, err)
		}
	}
}
