package main

import (
	"strings"
	"testing"
	"time"

	dedup "github.com/watermill-dedup/dedup"
)

// row is the storage row of store in w (compact: Redis with
// CompactKeys), or fails the test.
func (w windowView) row(t *testing.T, store string, compact bool) windowStorage {
	t.Helper()
	for _, r := range w.Storage {
		if r.Store == store && r.CompactKeys == compact {
			return r
		}
	}
	t.Fatalf("window -json has no storage row for %s (compact keys %v): %+v", store, compact, w)
	return windowStorage{}
}

// windowJSON runs window -json with args.
func windowJSON(t *testing.T, args ...string) windowView {
	t.Helper()
	var w windowView
	dedupctl(t, append([]string{"window", "-json"}, args...)...).want(t, exitOK).json(t, &w)
	return w
}

func value(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}

func TestWindow(t *testing.T) {
	w := windowJSON(t, "-store=redis", "-horizon=24h", "-rate=500", "-keys-per-message=2")
	if w.Retention != "31h12m0s" || w.RetentionSec != 112320 || w.Records != 112_320_000 || len(w.Storage) != 1 {
		t.Fatalf("window -json = %+v", w)
	}
	if r := w.row(t, storeRedis, false); value(r.BytesPerRecord) != 110.7 || value(r.Bytes) != 12_433_824_000 {
		t.Fatalf("window -json storage = %+v", r)
	}
	dedupctl(t, "window", "-store=redis", "-horizon=24h", "-rate=500", "-keys-per-message=2").
		want(t, exitOK, "stdout:31h12m0s", "stdout:1.3 x redelivery horizon 24h0m0s", "stdout:12.4 GB", "stdout:BENCHMARKS.md")
	w = windowJSON(t, "-store=redis", "-compact-keys", "-horizon=1h", "-rate=1")
	if r := w.row(t, storeRedis, true); value(r.BytesPerRecord) != 97.1 || w.Retention != "1h18m0s" || w.Records != 4680 || len(w.Storage) != 1 {
		t.Fatalf("window with -compact-keys = %+v", w)
	}
	w = windowJSON(t, "-store=postgres", "-horizon=7s", "-rate=1")
	if r := w.row(t, storePostgres, false); w.Retention != "10s" || value(r.BytesPerRecord) != 104.1 {
		t.Fatalf("window of 7s = %+v", w)
	}
	if err := dedup.CheckHorizon(10*time.Second, 7*time.Second); err != nil {
		t.Fatalf("the retention window prints is too short: %v", err)
	}
	w = windowJSON(t, "-store=sqlite", "-horizon=1h", "-rate=10", "-bytes-per-record=150")
	if r := w.row(t, storeSQLite, false); value(r.Bytes) != 150*46800 || r.Source != "-bytes-per-record" {
		t.Fatalf("window -bytes-per-record = %+v", w)
	}
	dedupctl(t, "window", "-store=memory", "-horizon=1h", "-rate=1").want(t, exitOK, "stdout:67.2")
	dedupctl(t, "window", "-rate=1").want(t, exitUsage, "stderr:needs -horizon")
	dedupctl(t, "window", "-store=oracle", "-horizon=1h", "-rate=1").want(t, exitUsage, `stderr:unknown store "oracle"`)
	dedupctl(t, "window", "-horizon=1h", "-rate=-5").want(t, exitUsage, "stderr:-rate must be positive")
}

// window is a calculator (#23): the retention always, and the storage of
// every store whose bytes a record are known unless -store or
// -bytes-per-record names one.
func TestWindowCalculator(t *testing.T) {
	r := dedupctl(t, "window", "-horizon=24h", "-rate=1000").want(t, exitOK, "stdout:31h12m0s", "stdout:1.3 x redelivery horizon 24h0m0s")
	for _, s := range []string{"memory", "redis", "redis -compact-keys", "postgres", "nats", "mysql", "sqlite", "-bytes-per-record"} {
		if !strings.Contains(r.stdout, s) {
			t.Fatalf("window without -store does not mention %q: %s", s, r)
		}
	}
	w := windowJSON(t, "-horizon=24h", "-rate=1000")
	if w.Retention != "31h12m0s" || w.Records != 112_320_000 {
		t.Fatalf("window -json = %+v", w)
	}
	for store, bpr := range map[string]float64{storeMemory: 67.2, storeRedis: 110.7, storePostgres: 104.1, storeNATS: 137.4} {
		row := w.row(t, store, false)
		if value(row.BytesPerRecord) != bpr || value(row.Bytes) != float64(int64(112_320_000*bpr+0.999)) {
			t.Fatalf("window -json row of %s = %+v, want %v bytes a record", store, row, bpr)
		}
	}
	if row := w.row(t, storeRedis, true); value(row.BytesPerRecord) != 97.1 {
		t.Fatalf("window -json row of Redis with CompactKeys = %+v", row)
	}
	for _, s := range []string{storeMySQL, storeSQLite} {
		if row := w.row(t, s, false); row.BytesPerRecord != nil || row.Bytes != nil || !strings.Contains(row.Source, "-bytes-per-record") {
			t.Fatalf("window -json row of %s = %+v, want no figure and the way to give one", s, row)
		}
	}

	// A store without a figure named: the retention, and how to size it.
	dedupctl(t, "window", "-store=mysql", "-horizon=1h", "-rate=1").want(t, exitOK, "stdout:1h18m0s", "stdout:no benchmark figure for mysql", "stdout:-bytes-per-record")
	// -bytes-per-record alone: that figure only.
	w = windowJSON(t, "-horizon=1h", "-rate=10", "-bytes-per-record=150")
	if len(w.Storage) != 1 || value(w.Storage[0].Bytes) != 150*46800 || w.Storage[0].Source != "-bytes-per-record" {
		t.Fatalf("window -bytes-per-record alone = %+v", w)
	}
	// Without -rate: the retention, and what -rate would add.
	dedupctl(t, "window", "-horizon=24h").want(t, exitOK, "stdout:31h12m0s", "stdout:-rate")
	w = windowJSON(t, "-horizon=24h")
	if w.Retention != "31h12m0s" || len(w.Storage) != 0 {
		t.Fatalf("window -json without -rate = %+v", w)
	}

	dedupctl(t, "window", "-horizon=-1h", "-rate=1").want(t, exitUsage, "stderr:-horizon must be positive, got -1h0m0s")
	dedupctl(t, "window", "-horizon=0s", "-rate=1").want(t, exitUsage, "stderr:-horizon must be positive")
	dedupctl(t, "window").want(t, exitUsage, "stderr:window needs -horizon")
	// A rate whose window overflows is a usage error, with or without
	// -json (it printed +Inf bytes, and -json failed with exit 1).
	dedupctl(t, "window", "-horizon=24h", "-rate=1e308").want(t, exitUsage, "stderr:-rate")
	dedupctl(t, "window", "-horizon=24h", "-rate=1e308", "-json").want(t, exitUsage, "stderr:-rate")
	dedupctl(t, "window", "-horizon=24h", "-rate=1000", "-bytes-per-record=1e308").want(t, exitUsage, "stderr:-bytes-per-record")
}

// A store registered in storeopen that window has no figure for (one just
// added) gets a row saying how to give one, not an empty table.
func TestWindowFiguresOfAStoreWithoutOne(t *testing.T) {
	got := windowFigures(&config{store: "toy"})
	if len(got) != 1 || got[0].store != "toy" || got[0].bytes != 0 || !strings.Contains(got[0].source, "give -bytes-per-record") {
		t.Fatalf("figures %+v, want one row for toy saying how to give its bytes a record", got)
	}
}
