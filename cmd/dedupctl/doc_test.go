package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/dedup/stores"
	"github.com/watermill-dedup/dedup/stores/storetest"
	"github.com/watermill-dedup/dedup/testkit"
)

var (
	shBlock    = regexp.MustCompile("(?s)```sh\n(.*?)```")
	docComment = regexp.MustCompile(`(?m)^//\t(go run \./cmd/dedupctl.*)$`)
)

// documentedCommand is a `go run ./cmd/dedupctl ...` line of the READMEs
// or of main.go's doc comment.
type documentedCommand struct {
	where, line string
	args        []string
}

func documentedCommands(t *testing.T) []documentedCommand {
	t.Helper()
	var out []documentedCommand
	add := func(where, line string) {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "go" || f[1] != "run" || f[2] != "./cmd/dedupctl" {
			return
		}
		out = append(out, documentedCommand{where, line, f[3:]})
	}
	for _, path := range []string{"../../README.md", "../../router_example/README.md"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, block := range shBlock.FindAllStringSubmatch(string(data), -1) {
			for _, line := range strings.Split(block[1], "\n") {
				add(path, line)
			}
		}
	}
	data, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range docComment.FindAllStringSubmatch(string(data), -1) {
		add("main.go", m[1])
	}
	return out
}

// Every command the docs show is a valid command line; the ones that read
// a run of the example (-run-id) run, as written but for a run id of
// their own, on a store holding the records they read; window runs.
func TestDocumentedCommands(t *testing.T) {
	cmds := documentedCommands(t)
	if len(cmds) < 10 {
		t.Fatalf("found %d documented commands, want the READMEs' and main.go's", len(cmds))
	}
	type exampleRun struct{ kind, runID string }
	var runs []documentedCommand
	runIDs := map[exampleRun]bool{}
	for _, c := range cmds {
		cfg, cmd, pos, err := parseArgs(c.args, func(string) string { return "" })
		if err == nil {
			err = (&cli{cfg: &cfg}).checkArgs(cmd, pos)
		}
		if err != nil {
			t.Errorf("%s: %s: %v", c.where, c.line, err)
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
		p := testkit.StoreParams{Teardown: true, CreateSchema: true}
		switch s.kind {
		case storeRedis:
			p.Kind, p.Addr, p.Name = testkit.StoreRedis, testkit.RequireRedis(t), "dedup:"+s.runID+":"
		case storeSQLite:
			if err := os.MkdirAll("loyalty", 0o755); err != nil {
				t.Fatal(err)
			}
			p.Kind, p.Path, p.Name = testkit.StoreSQLite, filepath.Join("loyalty", sqliteFile), "dedup_"+s.runID
		default:
			t.Fatalf("the docs show a run of the %s store, for which this test writes no records", s.kind)
		}
		o, closeStore, err := testkit.OpenStore(context.Background(), p)
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
		args := make([]string, len(c.args))
		for i, a := range c.args {
			for from, to := range ids {
				a = strings.ReplaceAll(a, from, to)
			}
			args[i] = a
		}
		if r := dedupctl(t, args...); r.code != exitOK {
			t.Errorf("%s: %s: %s", c.where, c.line, r)
		}
	}
}
