package ledger

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckNames(t *testing.T) {
	long := strings.Repeat("x", 10000)
	tests := []struct {
		name  string
		check func(string) error
		in    string
		want  string // in the error; "" to accept
	}{
		{"host", CheckHostName, "compute-1.example_a", ""},
		{"host of 253", CheckHostName, strings.Repeat("h", 253), ""},
		{"host of 254", CheckHostName, strings.Repeat("h", 254), "host names are 1-253 characters"},
		{"empty host", CheckHostName, "", `host name "": invalid input`},
		{"host with a hash tag", CheckHostName, "a{b}", `host name "a{b}"`},
		{"host with the key separator", CheckHostName, "a:b", `host name "a:b"`},
		{"host with a newline", CheckHostName, "a\nb", `host name "a\nb"`},
		{"long host, cut short", CheckHostName, long, `host name "xxxx`},
		{"guest", CheckGuestName, "web 1 (prod) {blue}: ü", ""},
		{"guest of 255 characters", CheckGuestName, strings.Repeat("ü", 255), ""},
		{"guest of 256 characters", CheckGuestName, strings.Repeat("ü", 256), "guest names are 1-255 printable characters"},
		{"empty guest", CheckGuestName, "", `guest name "": invalid input`},
		{"guest with a newline", CheckGuestName, "a\nb", `guest name "a\nb"`},
		{"guest with a control character", CheckGuestName, "a\x1bb", `guest name "a\x1bb"`},
		{"guest with a tab", CheckGuestName, "a\tb", `guest name "a\tb"`},
		{"guest with a slash", CheckGuestName, "a/b", `guest name "a/b"`},
		{"guest with a blank end", CheckGuestName, "ab ", `guest name "ab "`},
		{"guest not UTF-8", CheckGuestName, "a\xffb", `guest name "a\xffb"`},
		{"long guest, cut short", CheckGuestName, long, `guest name "` + strings.Repeat("x", 64) + `"... (10000 bytes)`},
	}
	for _, tt := range tests {
		err := tt.check(tt.in)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: check(%q) = %v, want nil", tt.name, tt.in, err)
		case tt.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: check(%.80q) = %v, want ErrInvalid and %q", tt.name, tt.in, err, tt.want)
		case err != nil && (len(err.Error()) > 300 || strings.Contains(err.Error(), "\n")):
			t.Errorf("%s: check(%.80q) = %q, want one short line", tt.name, tt.in, err)
		}
	}
}
