package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pinflow/pinflow/numa"
	"github.com/pinflow/pinflow/xmlpatch"
)

func xmlCommand() *cobra.Command {
	patch := &cobra.Command{Use: "patch --domain FILE --placement FILE", Short: "pin a domain XML to a placement", Args: noArgs,
		Long: `Rewrite the <cputune> and <numatune> of a domain XML for a placement, one
answer line of 'pinflow numa fit', and keep every other byte:
  pinflow numa fit case.json | pinflow xml patch --domain d.xml --placement -`}
	domainFile := patch.Flags().String("domain", "", "domain XML `FILE` to patch (- for standard input)")
	placementFile := patch.Flags().String("placement", "", "`FILE` holding one answer line of 'pinflow numa fit' (- for standard input)")
	required(patch, "domain", "placement")
	patch.RunE = func(c *cobra.Command, _ []string) error { return xmlPatch(domainFile, placementFile, c.OutOrStdout()) }

	read := &cobra.Command{Use: "read --domain FILE", Short: "print the pins a domain XML carries, as JSON", Args: noArgs}
	readFile := read.Flags().String("domain", "", "domain XML `FILE` to read (- for standard input)")
	required(read, "domain")
	read.RunE = func(c *cobra.Command, _ []string) error { return xmlRead(readFile, c.OutOrStdout()) }
	return group("xml", "patch and read the pinning of a domain XML", patch, read)
}

func xmlPatch(domainFile, placementFile *string, stdout io.Writer) error {
	if *domainFile == "-" && *placementFile == "-" {
		return fmt.Errorf("xml patch: --domain and --placement cannot both read standard input: %w", errUsage)
	}
	doc, err := readInput(*domainFile)
	if err != nil {
		return fmt.Errorf("xml patch: %w", err)
	}
	data, err := readInput(*placementFile)
	if err != nil {
		return fmt.Errorf("xml patch: %w", err)
	}
	p, err := placementFromAnswer(data)
	if err != nil {
		return fmt.Errorf("xml patch: %s: %w", displayName(*placementFile), err)
	}
	out, err := xmlpatch.Patch(string(doc), p)
	if err != nil {
		return fmt.Errorf("xml patch: %s: %w", displayName(*domainFile), err)
	}
	_, err = io.WriteString(stdout, out)
	return err
}

func xmlRead(domainFile *string, stdout io.Writer) error {
	doc, err := readInput(*domainFile)
	if err != nil {
		return fmt.Errorf("xml read: %w", err)
	}
	pins, err := xmlpatch.Read(string(doc))
	if err != nil {
		return fmt.Errorf("xml read: %s: %w", displayName(*domainFile), err)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(pins)
}

func displayName(file string) string {
	if file == "-" {
		return "standard input"
	}
	return file
}

// errNoPlacement marks an answer line that carries no placement to apply.
var errNoPlacement = errors.New("no placement to apply")

// placementFromAnswer reads one answer line of `pinflow numa fit` (or a
// bare placement object). Keys of the answer other than the placement's
// (id, fit, numa, why, ...) are read only to refuse a line without one.
func placementFromAnswer(data []byte) (*numa.Placement, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("empty; want one answer line of 'pinflow numa fit'")
		}
		return nil, fmt.Errorf("not a JSON answer line: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("holds more than one answer line; want exactly one")
	}
	var head struct {
		ID    json.RawMessage   `json:"id"`
		Fit   *bool             `json:"fit"`
		NUMA  *bool             `json:"numa"`
		Why   string            `json:"why"`
		Error *numa.AnswerError `json:"error"`
		Cells []json.RawMessage `json:"cells"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("not a JSON answer object: %v", err)
	}
	// Messages from the answer must not break the one-line error.
	flat := strings.NewReplacer("\n", " ", "\r", " ")
	head.Why = flat.Replace(head.Why)
	if head.Error != nil {
		head.Error.Message = flat.Replace(head.Error.Message)
	}
	id := ""
	if len(head.ID) > 0 {
		id = " " + string(head.ID)
	}
	switch {
	case head.Error != nil:
		return nil, fmt.Errorf("answer%s is an invalid request (%s: %s): %w", id, head.Error.Type, head.Error.Message, errNoPlacement)
	case head.Fit != nil && !*head.Fit:
		why := ""
		if head.Why != "" {
			why = " (" + head.Why + ")"
		}
		return nil, fmt.Errorf("answer%s says fit=false%s: %w", id, why, errNoPlacement)
	case head.NUMA != nil && !*head.NUMA:
		return nil, fmt.Errorf("answer%s says numa=false: the guest has no NUMA placement, so nothing to pin: %w", id, errNoPlacement)
	case len(head.Cells) == 0:
		return nil, fmt.Errorf("answer%s has no cells: %w", id, errNoPlacement)
	}
	var p numa.Placement
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
