package ledger

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestNameRules checks the name validators against the rules written as
// regular expressions, on edge cases and random strings.
func TestNameRules(t *testing.T) {
	rules := []struct {
		name  string
		valid func(string) bool
		re    *regexp.Regexp
	}{
		{"host or instance uuid", validKeyName, regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$`)},
		{"claim id", validClaimID, regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}$`)},
		{"prefix", validPrefix, regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`)},
	}
	cases := []string{"", "a", "-a", "a-", "h{1}", "a b", "é", "a/b", "a@b+c=d", ".x", "x.", "0", strings.Repeat("a", 64),
		strings.Repeat("a", 65), strings.Repeat("a", 200), strings.Repeat("a", 201), strings.Repeat("a", 253), strings.Repeat("a", 254)}
	const alphabet = "aZ09._:-/@+={} \x00é"
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, rng.IntN(8))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, r := range rules {
		for _, s := range cases {
			if got, want := r.valid(s), r.re.MatchString(s); got != want {
				t.Errorf("%s %q: valid = %v, the rule says %v", r.name, s, got, want)
			}
		}
	}
}
