package xmlpatch

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strings"
)

// nodeKind tells elements from the other pieces of a document.
type nodeKind int

const (
	elementNode nodeKind = iota
	textNode             // character data, CDATA included
	otherNode            // comment, processing instruction
)

// node is one piece of the source document with its byte range, so that
// rewriting one element can copy every other byte as it was.
type node struct {
	kind nodeKind
	// name is the qualified name as written ("vcpupin", "qemu:commandline").
	name  string
	attrs []xml.Attr // names as written: Space holds the prefix, not a URI
	// start is the offset of '<' (or of the text); inner follows the start
	// tag; innerEnd is the offset of the end tag; end follows the element.
	// For <x/>, inner == innerEnd == end.
	start, inner, innerEnd, end int
	children                    []*node
	text                        string // decoded character data of a text node
}

// parseTree reads a whole document into a tree of nodes with their byte
// offsets. It accepts exactly one root element with only whitespace,
// comments and declarations around it.
func parseTree(doc string) (*node, error) {
	d := xml.NewDecoder(strings.NewReader(doc))
	d.Strict = true
	var root *node
	var stack []*node
	for {
		before := int(d.InputOffset())
		tok, err := d.RawToken()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		after := int(d.InputOffset())
		var parent *node
		if len(stack) > 0 {
			parent = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if parent == nil && root != nil {
				return nil, fmt.Errorf("second root element <%s> on line %d", qname(t.Name), line(doc, before))
			}
			if err := checkAttrs(t); err != nil {
				return nil, err
			}
			n := &node{kind: elementNode, name: qname(t.Name), attrs: t.Attr, start: before, inner: after}
			if parent == nil {
				root = n
			} else {
				parent.children = append(parent.children, n)
			}
			stack = append(stack, n)
		case xml.EndElement:
			if parent == nil {
				return nil, fmt.Errorf("end tag </%s> on line %d closes nothing", qname(t.Name), line(doc, before))
			}
			if qname(t.Name) != parent.name {
				return nil, fmt.Errorf("end tag </%s> on line %d closes <%s>", qname(t.Name), line(doc, before), parent.name)
			}
			parent.innerEnd, parent.end = before, after
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if parent == nil {
				if strings.TrimSpace(string(t)) != "" {
					return nil, fmt.Errorf("text outside the root element on line %d", line(doc, before))
				}
				continue
			}
			parent.children = append(parent.children, &node{kind: textNode, start: before, end: after, text: string(t)})
		case xml.Directive:
			if parent != nil || root != nil {
				return nil, fmt.Errorf("declaration <!%.20s on line %d is only allowed before the root element", t, line(doc, before))
			}
		case xml.Comment, xml.ProcInst:
			if parent != nil {
				parent.children = append(parent.children, &node{kind: otherNode, start: before, end: after})
			}
		}
	}
	if len(stack) > 0 {
		return nil, fmt.Errorf("document ends inside <%s>", stack[len(stack)-1].name)
	}
	if root == nil {
		return nil, errors.New("no root element")
	}
	return root, nil
}

// checkAttrs rejects a repeated attribute, which encoding/xml accepts but
// XML (and libvirt) does not.
func checkAttrs(t xml.StartElement) error {
	for i := range t.Attr {
		for j := range i {
			if t.Attr[i].Name == t.Attr[j].Name {
				return fmt.Errorf("<%s> repeats attribute %s", qname(t.Name), qname(t.Attr[i].Name))
			}
		}
	}
	return nil
}

// line returns the 1-based line of offset in doc.
func line(doc string, offset int) int {
	return 1 + strings.Count(doc[:offset], "\n")
}

func qname(n xml.Name) string {
	if n.Space == "" {
		return n.Local
	}
	return n.Space + ":" + n.Local
}

// attr returns the value of an unprefixed attribute and whether it is set.
func (n *node) attr(name string) (string, bool) {
	for _, a := range n.attrs {
		if a.Name.Space == "" && a.Name.Local == name {
			return a.Value, true
		}
	}
	return "", false
}

// elements returns the element children named name.
func (n *node) elements(name string) []*node {
	var out []*node
	for _, c := range n.children {
		if c.kind == elementNode && c.name == name {
			out = append(out, c)
		}
	}
	return out
}

// textContent returns the decoded text directly inside the element.
func (n *node) textContent() string {
	var sb strings.Builder
	for _, c := range n.children {
		if c.kind == textNode {
			sb.WriteString(c.text)
		}
	}
	return sb.String()
}

// isBlank reports whether the node is whitespace as written, so dropping or
// re-indenting it changes nothing a parser keeps.
func (n *node) isBlank(doc string) bool {
	return n.kind == textNode && strings.TrimLeft(doc[n.start:n.end], " \t\r\n") == ""
}

// indentOf returns the spaces and tabs between the start of the line and
// offset, and whether offset starts its line; a compact document has none.
func indentOf(doc string, offset int) (string, bool) {
	i := offset
	for i > 0 && (doc[i-1] == ' ' || doc[i-1] == '\t') {
		i--
	}
	if i == 0 || doc[i-1] == '\n' {
		return doc[i:offset], true
	}
	return "", false
}
