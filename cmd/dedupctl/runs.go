package main

import (
	"cmp"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
)

// router_example keeps each run's Redis records under "dedup:<run id>:",
// inside redisstore's default prefix "dedup:", all in its scope
// "loyalty". Read with the default prefix, such a key would be a record
// of the scope "<run id>" and the key "loyalty…", and one whose packed
// message id holds a '%' or a '{' a key the store does not write. With
// the default prefix, dedupctl tells the store that they are not its
// records (redisstore.Config.Foreign): stats counts them by run and says
// how to reach them (-run-id), list passes over them. An explicit
// -redis-prefix=dedup: reads them as the store with that prefix would.

// exampleRunKey matches a key of a router_example run: the run id (as
// router_example's -run-id allows it), then the scope loyalty and a kind
// byte of redisstore's layout.
var exampleRunKey = regexp.MustCompile(`^dedup:([a-z0-9]{1,16}):loyalty[:=#]`)

// exampleScope is router_example's scope, the handler's name.
const exampleScope = "loyalty"

// runTally counts the keys of example runs the store was told to pass
// over, by run id.
type runTally struct {
	mu   sync.Mutex
	keys map[string]int64
}

// foreign is the store's Config.Foreign: it reports the keys of
// router_example runs, and counts them.
func (t *runTally) foreign(key string) bool {
	m := exampleRunKey.FindStringSubmatch(key)
	if m == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.keys == nil {
		t.keys = map[string]int64{}
	}
	t.keys[m[1]]++
	return true
}

// take returns the runs counted since the last take, by run id, and
// starts counting anew.
func (t *runTally) take() []skippedRun {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]skippedRun, 0, len(t.keys))
	for id, n := range t.keys {
		out = append(out, skippedRun{RunID: id, Keys: n})
	}
	t.keys = nil
	slices.SortFunc(out, func(a, b skippedRun) int { return cmp.Compare(a.RunID, b.RunID) })
	return out
}

// skippedRun is a router_example run whose keys were passed over.
type skippedRun struct {
	RunID string `json:"run_id"`
	Keys  int64  `json:"keys"`
}

// runKeys is the number of keys runs holds.
func runKeys(runs []skippedRun) int64 {
	var n int64
	for _, r := range runs {
		n += r.Keys
	}
	return n
}

// writeRuns writes the runs whose keys a stats or list passed over, and
// how to read them.
func writeRuns(w io.Writer, runs []skippedRun) {
	if len(runs) == 0 {
		return
	}
	n := runKeys(runs)
	fmt.Fprintf(w, "\nskipped %d %s of %d router_example %s, under \"dedup:<run id>:\" (scope %+q): not records of the prefix \"dedup:\"; read a run's with -run-id:\n",
		n, plural(int(n), "key", "keys"), len(runs), plural(len(runs), "run", "runs"), exampleScope)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tKEYS\tFLAG")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%d\t-run-id=%s\n", r.RunID, r.Keys, r.RunID)
	}
	tw.Flush()
}

// writeSkipped writes the keys under the prefix a stats passed over that
// are not of example runs.
func writeSkipped(w io.Writer, n int64, sample []string) {
	if n <= 0 {
		return
	}
	var such []string
	for _, id := range sample {
		if !exampleRunKey.MatchString(id) {
			such = append(such, `"`+id+`"`)
		}
	}
	eg := ""
	if len(such) > 0 {
		eg = ", such as " + strings.Join(such, ", ")
	}
	fmt.Fprintf(w, "\nskipped %d %s under the prefix that %s not the store's records%s: another layout's (-compact-keys, -digest-keys-longer-than), another store's with a longer prefix (-redis-prefix), or another program's\n",
		n, plural(int(n), "key", "keys"), plural(int(n), "is", "are"), eg)
}
