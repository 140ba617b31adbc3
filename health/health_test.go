package health

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	ok := Check{Name: "redis", Endpoint: "redis://r:6379/0", Run: func(context.Context) error { return nil }}
	down := Check{Name: "temporal", Endpoint: "t:7233", Run: func(context.Context) error { return errors.New("connection refused\nretrying") }}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "pinflow_ledger_claims_total 1\n") })
	tests := []struct {
		name       string
		checks     []Check
		metrics    http.Handler
		path       string
		wantStatus int
		wantBody   string
	}{
		{"live", []Check{down}, nil, "/livez", 200, "ok\n"},
		{"ready", []Check{ok}, nil, "/readyz", 200, "redis redis://r:6379/0: ok\n"},
		{"not ready", []Check{ok, down}, nil, "/readyz", 503, "redis redis://r:6379/0: ok\ntemporal t:7233: connection refused retrying\n"},
		{"metrics", nil, metrics, "/metrics", 200, "pinflow_ledger_claims_total 1\n"},
		{"no metrics", nil, nil, "/metrics", 404, "404 page not found\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			Handler(tt.checks, tt.metrics).ServeHTTP(rec, httptest.NewRequest("GET", tt.path, nil))
			if rec.Code != tt.wantStatus || rec.Body.String() != tt.wantBody {
				t.Errorf("GET %s = %d %q, want %d %q", tt.path, rec.Code, rec.Body.String(), tt.wantStatus, tt.wantBody)
			}
		})
	}
}

func TestServeBadAddress(t *testing.T) {
	err := Serve(context.Background(), "127.0.0.1:notaport", Handler(nil, nil), func(error) {})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:notaport") {
		t.Errorf("Serve(127.0.0.1:notaport) = %v, want an error naming the address", err)
	}
}
