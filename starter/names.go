package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/pinflow/pinflow/ledger"
)

// nameFlags are the flags that take a host, guest or group name, in every
// command: checkNameFlags checks them with the ledger's rules, so that a
// name the ledger would refuse is refused before anything starts.
var nameFlags = map[string]func(string) error{
	"host":  ledger.CheckHostName,
	"dest":  ledger.CheckHostName,
	"name":  ledger.CheckGuestName,
	"group": ledger.CheckGroupName,
}

// checkNameFlags refuses a name flag of fs, given to command cmd, that
// was given a bad name, or an empty one: leaving a flag out is how a
// command is told to choose, and an empty value is more likely a
// script's unset variable. A repeatable flag's names are checked one by
// one.
func checkNameFlags(cmd string, fs *pflag.FlagSet) error {
	var err error
	fs.Visit(func(f *pflag.Flag) {
		check, ok := nameFlags[f.Name]
		if !ok || err != nil {
			return
		}
		values := []string{f.Value.String()}
		if s, ok := f.Value.(pflag.SliceValue); ok {
			values = s.GetSlice()
		}
		for _, v := range values {
			if v == "" {
				err = fmt.Errorf("%s: --%s is empty; give a name, or leave --%s out: %w", cmd, f.Name, f.Name, errUsage)
			} else if e := check(v); e != nil {
				err = fmt.Errorf("%s: --%s: %v: %w", cmd, f.Name, e, errUsage)
			}
			if err != nil {
				return
			}
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
