package config

import (
	"encoding"
	"fmt"
	"io"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
)

//go:generate go run ./internal/refgen -o reference_gen.go

// Var is one PINFLOW_* variable of the reference.
type Var struct {
	Name    string
	Type    string
	Default string
	// Description is the doc comment of the field the variable sets.
	Description string
	// Secret variables are never logged nor printed with their values.
	Secret bool
}

// secrets are the variables whose values are credentials.
var secrets = map[string]bool{
	Prefix + "_TEMPORAL_API_KEY": true,
	Prefix + "_REDIS_PASSWORD":   true,
	// A redis:// URL may carry a password.
	Prefix + "_REDIS_URL": true,
}

// Reference lists every variable Load reads, in Config's field order,
// with its default and its field's doc comment. It walks Config the way
// envconfig does, and takes each default from where Load does (the
// field's tag, or else the configuration Load starts from), so it cannot
// drift from what Load reads.
func Reference() []Var {
	var out []Var
	walk(reflect.ValueOf(defaults()), Prefix, &out)
	return out
}

func walk(v reflect.Value, prefix string, out *[]Var) {
	t := v.Type()
	for f := range t.Fields() {
		if !f.IsExported() || f.Tag.Get("ignored") == "true" {
			continue
		}
		key := f.Name
		if alt := f.Tag.Get("envconfig"); alt != "" {
			key = alt
		}
		key = strings.ToUpper(prefix + "_" + key)
		if IsStructOfVariables(f.Type) {
			inner := prefix
			if !f.Anonymous {
				inner = key
			}
			walk(v.FieldByIndex(f.Index), inner, out)
			continue
		}
		def := f.Tag.Get("default")
		if fv := v.FieldByIndex(f.Index); def == "" && !fv.IsZero() {
			def = formatDefault(fv)
		}
		*out = append(*out, Var{
			Name:        key,
			Type:        typeName(f.Type),
			Default:     def,
			Description: fieldDocs[t.PkgPath()+"."+t.Name()+"."+f.Name],
			Secret:      secrets[key],
		})
	}
}

// formatDefault writes v as its variable would be set, a duration in
// its largest whole unit ("1m", "150s", "500ms").
func formatDefault(v reflect.Value) string {
	if d, ok := v.Interface().(time.Duration); ok {
		for _, u := range []struct {
			unit time.Duration
			name string
		}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
			if d%u.unit == 0 {
				return fmt.Sprintf("%d%s", d/u.unit, u.name)
			}
		}
		return d.String()
	}
	return fmt.Sprint(v.Interface())
}

// IsStructOfVariables says whether envconfig reads t's fields as
// variables of their own, rather than decoding t from one variable.
func IsStructOfVariables(t reflect.Type) bool {
	if t.Kind() != reflect.Struct {
		return false
	}
	p := reflect.PointerTo(t)
	for _, iface := range []reflect.Type{
		reflect.TypeFor[envconfig.Decoder](), reflect.TypeFor[envconfig.Setter](),
		reflect.TypeFor[encoding.TextUnmarshaler](), reflect.TypeFor[encoding.BinaryUnmarshaler](),
	} {
		if p.Implements(iface) {
			return false
		}
	}
	return true
}

func typeName(t reflect.Type) string {
	p := reflect.PointerTo(t)
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "duration"
	case p.Implements(reflect.TypeFor[envconfig.Decoder]()), p.Implements(reflect.TypeFor[encoding.TextUnmarshaler]()):
		return "NAME=VALUE,..."
	}
	switch t.Kind() {
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		return "list (a,b,...)"
	case reflect.Map:
		return "map (k:v,...)"
	}
	return "string"
}

// WriteReference writes the reference as an aligned text table or, with
// markdown, as a Markdown table.
func WriteReference(w io.Writer, markdown bool) error {
	vars := Reference()
	if markdown {
		if _, err := fmt.Fprintln(w, "| Variable | Type | Default | Description |\n|---|---|---|---|"); err != nil {
			return err
		}
		for _, v := range vars {
			def := "(none)"
			if v.Default != "" {
				def = "`" + v.Default + "`"
			}
			if _, err := fmt.Fprintf(w, "| `%s` | %s | %s | %s |\n", v.Name, v.Type, def, mdEscape(describe(v))); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tTYPE\tDEFAULT\tDESCRIPTION")
	for _, v := range vars {
		def := "-"
		if v.Default != "" {
			def = v.Default
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Name, v.Type, def, describe(v))
	}
	return tw.Flush()
}

func describe(v Var) string {
	if v.Secret {
		return v.Description + " Secret: never logged."
	}
	return v.Description
}

func mdEscape(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}
