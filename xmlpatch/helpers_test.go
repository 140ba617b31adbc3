package xmlpatch

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pinflow/pinflow/numa"
)

// canon is a canonical XML tree: names with resolved namespaces,
// attributes as a set, children in order, text trimmed, comments dropped.
type canon struct {
	Name  string
	Attrs map[string]string
	Text  string
	Kids  []*canon
}

// canonical parses doc with encoding/xml, independently of the package's
// own offset-keeping parser.
func canonical(doc string) (*canon, error) {
	d := xml.NewDecoder(strings.NewReader(doc))
	var stack []*canon
	var root *canon
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			c := &canon{Name: t.Name.Space + " " + t.Name.Local, Attrs: map[string]string{}}
			for _, a := range t.Attr {
				c.Attrs[a.Name.Space+" "+a.Name.Local] = a.Value
			}
			if len(stack) == 0 {
				if root != nil {
					return nil, errors.New("two root elements")
				}
				root = c
			} else {
				p := stack[len(stack)-1]
				p.Kids = append(p.Kids, c)
			}
			stack = append(stack, c)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if s := strings.TrimSpace(string(t)); s != "" && len(stack) > 0 {
				p := stack[len(stack)-1]
				p.Kids = append(p.Kids, &canon{Name: "#text", Text: s})
			}
		}
	}
	if root == nil || len(stack) > 0 {
		return nil, errors.New("no complete root element")
	}
	return root, nil
}

func mustCanonical(t testing.TB, what, doc string) *canon {
	t.Helper()
	c, err := canonical(doc)
	if err != nil {
		t.Fatalf("%s does not parse: %v", what, err)
	}
	return c
}

// split returns the root without its direct children named in names, and
// those children by name.
func split(c *canon, names ...string) (*canon, map[string][]*canon) {
	rest := *c
	rest.Kids = nil
	picked := map[string][]*canon{}
	for _, k := range c.Kids {
		hit := false
		for _, n := range names {
			if k.Name == " "+n {
				picked[n] = append(picked[n], k)
				hit = true
			}
		}
		if !hit {
			rest.Kids = append(rest.Kids, k)
		}
	}
	return &rest, picked
}

// checkUntouched fails unless everything outside <cputune> and <numatune>
// of got equals that of src canonically.
func checkUntouched(t testing.TB, name, src, got string) {
	t.Helper()
	srcRest, _ := split(mustCanonical(t, name+" source", src), "cputune", "numatune")
	gotRest, _ := split(mustCanonical(t, name+" output", got), "cputune", "numatune")
	if diff := cmp.Diff(srcRest, gotRest); diff != "" {
		t.Errorf("Patch(%s): document outside <cputune>/<numatune> changed (-source +got):\n%s", name, diff)
	}
}

func readFile(t testing.TB, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// placementFile reads an answer line of `pinflow numa fit` or Nova's fit.
func placementFile(t testing.TB, name string) *numa.Placement {
	t.Helper()
	var p numa.Placement
	if err := json.Unmarshal([]byte(readFile(t, name)), &p); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &p
}

// pinflowFit answers testdata/dest-host-case.json with pinflow's own fit.
func pinflowFit(t testing.TB) *numa.Placement {
	t.Helper()
	cases, err := numa.ReadCases([]byte(readFile(t, "dest-host-case.json")))
	if err != nil || len(cases) != 1 {
		t.Fatalf("dest-host-case.json: %d cases, %v", len(cases), err)
	}
	ans := cases[0].Solve()
	if ans.Placement == nil {
		t.Fatalf("dest-host-case.json: no placement: %+v", ans)
	}
	return ans.Placement
}
