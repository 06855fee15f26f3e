package main

import (
	"flag"
	"slices"

	"github.com/watermill-dedup/dedup/internal/storeopen"
)

// impliedStore is the store that the command line's flags point at, when
// they point at one only: -redis-addr=redis://host:6379/0 alone means
// -store=redis. The environment implies nothing: a shell's REDIS_ADDR
// may well be there for other programs.
func impliedStore(given []string) string {
	var found []string
	for _, name := range given {
		if s := storeopen.FlagKind(name); s != "" && !slices.Contains(found, s) {
			found = append(found, s)
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return ""
}

// trackSets makes every flag of fs record its name in given when it is
// set (the command line's, once the environment's are in).
func trackSets(fs *flag.FlagSet, given *[]string) {
	fs.VisitAll(func(f *flag.Flag) {
		f.Value = &trackedValue{Value: f.Value, set: func() { *given = append(*given, f.Name) }}
	})
}

// trackedValue is a flag.Value that reports each Set.
type trackedValue struct {
	flag.Value
	set func()
}

func (v *trackedValue) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return err
	}
	v.set()
	return nil
}

// IsBoolFlag keeps -flag (without =true) working for a bool flag.
func (v *trackedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
