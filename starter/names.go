package main

import (
	"flag"
	"fmt"

	"github.com/pinflow/pinflow/ledger"
)

// nameFlags are the flags that take a host or a guest name, in every
// command: parseFlags checks them with the ledger's rules, so that a name
// the ledger would refuse is refused before anything starts.
var nameFlags = map[string]func(string) error{
	"host": ledger.CheckHostName,
	"dest": ledger.CheckHostName,
	"name": ledger.CheckGuestName,
}

// checkNameFlags refuses a name flag of fs that was given a bad name, or
// an empty one: leaving a flag out is how a command is told to choose,
// and an empty value is more likely a script's unset variable.
func checkNameFlags(fs *flag.FlagSet) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		check, ok := nameFlags[f.Name]
		if !ok || err != nil {
			return
		}
		if v := f.Value.String(); v == "" {
			err = fmt.Errorf("%s: --%s is empty; give a name, or leave --%s out: %w", fs.Name(), f.Name, f.Name, errUsage)
		} else if e := check(v); e != nil {
			err = fmt.Errorf("%s: --%s: %v: %w", fs.Name(), f.Name, e, errUsage)
		}
	})
	return err
}

// checkHostArg refuses a host name given as an argument of cmd.
func checkHostArg(cmd, host string) error {
	if err := ledger.CheckHostName(host); err != nil {
		return fmt.Errorf("%s: %v: %w", cmd, err, errUsage)
	}
	return nil
}
