package main

import (
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/readmetest"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
)

// The README's dedupctl commands on a store of the reader's own (SQL,
// NATS) run in the order it gives them, each on a store of the test's
// own (its table or bucket named after the documented flags, which it
// wins over) holding the records they name: a record the command reads
// or deletes, a claim an id names (the documented id replaced by the
// claim's). Redis's run after an example run (TestReadmeFlows), window
// and the -run-id ones in TestDocumentedCommands; a command on a server
// of the reader's own (a .internal host with its credential files) is
// only parsed there.
func TestReadmeCommandsOnOwnStores(t *testing.T) {
	kinds := map[string]anystore.StoreKind{
		storePostgres: anystore.StorePostgres, storeMySQL: anystore.StoreMySQL,
		storeSQLite: anystore.StoreSQLite, storeNATS: anystore.StoreNATS,
	}
	type step struct {
		c   readmetest.Command
		cfg config
		cmd string
		pos []string
	}
	var steps []step
	for _, c := range readmetest.Commands(t, "./cmd/dedupctl", "../../README.md") {
		cfg, cmd, pos, err := parseArgs(c.Args, func(string) string { return "" })
		if err != nil {
			t.Fatalf("%s: %s: %v", c.Where, c.Line, err)
		}
		if _, ok := kinds[cfg.store]; !ok || cmd == "window" || cfg.runID != "" {
			continue
		}
		if strings.Contains(c.Line, ".internal") {
			t.Logf("only parsed, a server of the reader's own: %s", c.Line)
			continue
		}
		steps = append(steps, step{c, cfg, cmd, pos})
	}
	if len(steps) < 6 {
		t.Fatalf("README.md shows %d dedupctl commands on SQL and NATS stores, want its get, forget, purge, stats, list and release -id", len(steps))
	}

	// The stores, and the records the commands name.
	e := &env{}
	targets := map[string]*target{}
	ids := map[string]string{} // documented id -> the test's
	seeded := map[string]bool{}
	for _, s := range steps {
		tg := targets[s.cfg.store]
		if tg == nil {
			tg = e.open(t, kinds[s.cfg.store], "")
			targets[s.cfg.store] = tg
		}
		scope, key := "", ""
		switch {
		case s.cfg.id != "":
			scope, key = "loyalty", "readme-"+s.cfg.id
		case len(s.pos) == 2:
			scope, key = s.pos[0], s.pos[1]
		default:
			continue
		}
		if seeded[s.cfg.store+"\x00"+scope+"\x00"+key] {
			continue
		}
		seeded[s.cfg.store+"\x00"+scope+"\x00"+key] = true
		if s.cmd == "release" {
			tg.claim(t, scope, key, time.Minute)
		} else {
			tg.done(t, scope, key)
		}
		if s.cfg.id != "" {
			r, err := tg.admin.Get(t.Context(), scope, key)
			if err != nil {
				t.Fatal(err)
			}
			ids[s.cfg.id] = r.ID
		}
	}

	for _, s := range steps {
		args := make([]string, len(s.c.Args))
		for i, a := range s.c.Args {
			for doc, id := range ids {
				a = strings.ReplaceAll(a, doc, id)
			}
			args[i] = a
		}
		want := exitOK
		if (s.cmd == "forget" || s.cmd == "release") && !s.cfg.yes {
			want = exitRefused // the dry run the README shows
		}
		// The test's flags after the documented ones: they win.
		r := dedupctl(t, append(args, targets[s.cfg.store].args...)...)
		if r.code != want || !ascii(r.stdout) {
			t.Fatalf("%s: %s: want exit %d: %s", s.c.Where, s.c.Line, want, r)
		}
	}
}
