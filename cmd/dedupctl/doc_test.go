package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/internal/readmetest"
	"github.com/watermill-dedup/dedup/internal/testkit"
	"github.com/watermill-dedup/dedup/internal/testkit/anystore"
	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
)

// Every command the docs show is a valid command line; the ones that read
// a run of the example (-run-id) run, as written but for a run id of
// their own, on a store holding the records they read; window runs.
func TestDocumentedCommands(t *testing.T) {
	cmds := readmetest.Commands(t, "./cmd/dedupctl", "../../README.md", "../../router_example/README.md", "main.go")
	if len(cmds) < 10 {
		t.Fatalf("found %d documented commands, want the READMEs' and main.go's", len(cmds))
	}
	type exampleRun struct{ kind, runID string }
	var runs []readmetest.Command
	runIDs := map[exampleRun]bool{}
	for _, c := range cmds {
		cfg, cmd, pos, err := parseArgs(c.Args, func(string) string { return "" })
		if err == nil {
			err = (&cli{cfg: &cfg}).checkArgs(cmd, pos)
		}
		if err != nil {
			t.Errorf("%s: %s: %v", c.Where, c.Line, err)
			continue
		}
		if cfg.runID != "" || cmd == "window" {
			runs = append(runs, c)
			if cfg.runID != "" {
				runIDs[exampleRun{cfg.store, cfg.runID}] = true
			}
		}
	}
	if len(runIDs) == 0 {
		t.Fatal("the docs show no command on an example run (-run-id)")
	}

	// The records the commands read: the example's scope and keys, under
	// run ids of the test's own (the services are shared).
	ids := map[string]string{}
	for s := range runIDs {
		ids[s.runID] = storetest.NewID()[:8]
	}
	t.Chdir(t.TempDir()) // -dir=./loyalty
	for s := range runIDs {
		s.runID = ids[s.runID]
		p := anystore.StoreParams{Teardown: true, CreateSchema: true}
		switch s.kind {
		case storeRedis:
			p.Kind, p.Addr, p.Name = anystore.StoreRedis, testkit.RequireRedis(t), "router_example:"+s.runID+":"
		case storeSQLite:
			if err := os.MkdirAll("loyalty", 0o755); err != nil {
				t.Fatal(err)
			}
			p.Kind, p.Path, p.Name = anystore.StoreSQLite, filepath.Join("loyalty", sqliteFile), "router_example_"+s.runID
		case storeNATS:
			p.Kind, p.Addr, p.Name = anystore.StoreNATS, anystore.RequireStore(t, anystore.StoreNATS), "router_example_"+s.runID
		default:
			t.Fatalf("the docs show a run of the %s store, for which this test writes no records", s.kind)
		}
		o, closeStore, err := anystore.OpenStore(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = closeStore(context.Background()) })
		for _, n := range []string{"000040", "000041", "000042", "000043"} {
			c, err := o.Store.Claim(t.Context(), "loyalty", []string{"payment:PAY-" + s.runID + "-evt-" + n}, time.Minute)
			if err != nil || c.Result != stores.Claimed {
				t.Fatalf("Claim: %+v, %v", c, err)
			}
			if err := o.Store.Complete(t.Context(), c, time.Hour, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("running %d of the %d documented commands", len(runs), len(cmds))
	for _, c := range runs {
		args := make([]string, len(c.Args))
		for i, a := range c.Args {
			for from, to := range ids {
				a = strings.ReplaceAll(a, from, to)
			}
			args[i] = a
		}
		if r := dedupctl(t, args...); r.code != exitOK {
			t.Errorf("%s: %s: %s", c.Where, c.Line, r)
		}
	}
}
