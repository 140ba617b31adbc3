package hypervisor

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseUUID(t *testing.T) {
	const canonical = "0f8fad5b-d9cb-469f-a165-70867728950e"
	tests := []struct {
		name, in, want string // want "": an error
	}{
		{"canonical", canonical, canonical},
		{"upper case", "0F8FAD5B-D9CB-469F-A165-70867728950E", canonical},
		{"no dashes", "0f8fad5bd9cb469fa16570867728950e", canonical},
		{"blanks around", " " + canonical + "\n", canonical},
		{"empty", "", ""},
		{"one digit too many", canonical + "0", ""},
		{"one digit too few", "0f8fad5b-d9cb-469f-a165-70867728950", ""},
		{"not hex", "0f8fad5b-d9cb-469f-a165-70867728950g", ""},
		{"braces", "{" + canonical + "}", ""},
		{"urn", "urn:uuid:" + canonical, ""},
		{"not a uuid", "not-a-uuid", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := ParseUUID(tt.in)
			if tt.want == "" {
				if err == nil || !strings.Contains(err.Error(), strconv.Quote(tt.in)) {
					t.Errorf("ParseUUID(%q) = %s, %v; want an error naming the input", tt.in, u, err)
				}
				return
			}
			if err != nil || u.String() != tt.want {
				t.Errorf("ParseUUID(%q) = %s, %v; want %s", tt.in, u, err, tt.want)
			}
		})
	}
}
