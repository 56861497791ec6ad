package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/stubbornhq/stubborn/delegates"
)

// newFlagSet returns a flag set that reports errors instead of exiting,
// and prints nothing itself: parseFlags words its errors, and prints the
// flags on -h.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// flagErrors match the flag package's wording of a flag not defined and
// of a value that does not parse.
var (
	flagUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	flagBadValue  = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for flag -(\S+): `)
)

// parseFlags parses args with fs, and words its errors for a person: an
// unknown flag gets the closest one's name (not the whole usage), a
// duration without a unit the unit it needs. -h prints the flags on
// stderr and returns flag.ErrHelp, which run turns into exit 0.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil {
		return nil
	}
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "Usage of stubborn %s:\n", fs.Name())
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return err
	}
	return flagError(fs, err)
}

// flagError words a flag parsing error of fs.
func flagError(fs *flag.FlagSet, err error) error {
	list := fmt.Sprintf("(`stubborn %s -h` lists its flags)", fs.Name())
	if m := flagUndefined.FindStringSubmatch(err.Error()); m != nil {
		name, _, _ := strings.Cut(m[1], "=")
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if best := delegates.Closest(name, names); best != "" {
			return fmt.Errorf("unknown flag -%s: did you mean -%s? %s", name, best, list)
		}
		return fmt.Errorf("unknown flag -%s %s", name, list)
	}
	if m := flagBadValue.FindStringSubmatch(err.Error()); m != nil {
		value, name := m[1], m[2]
		if f := fs.Lookup(name); f != nil {
			if g, ok := f.Value.(flag.Getter); ok {
				if _, isDuration := g.Get().(time.Duration); isDuration {
					hint := "such as 500ms, 10s, 1m30s"
					if _, err := strconv.ParseFloat(value, 64); err == nil {
						hint = value + "s"
					}
					return fmt.Errorf("-%s %s: durations need a unit: %s", name, value, hint)
				}
			}
			return fmt.Errorf("-%s %q: %s (%s)", name, value, strings.TrimSpace(err.Error()[len(m[0]):]), f.Usage)
		}
	}
	return err
}
