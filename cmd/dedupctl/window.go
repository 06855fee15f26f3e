package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	dedup "github.com/watermill-dedup/dedup"
)

// window is a calculator: the retention a redelivery horizon needs
// (always), and the storage it takes at a rate (with -rate) for the store
// -store or -bytes-per-record names, or for every store whose bytes a
// record are known. It connects to nothing.

// Bytes a done record without data takes, from BENCHMARKS.md (the
// "memory ≤ 110 B/record" row of the goals table: 10⁶ done records of
// 36-byte keys): memstore 67.2 B, PostgreSQL 104.1 B, Redis 110.7 B with
// the default layout and 97.1 B with CompactKeys. MySQL and SQLite have no
// figure there.
const (
	memoryBytesPerRecord       = 67.2
	postgresBytesPerRecord     = 104.1
	redisBytesPerRecord        = 110.7
	redisCompactBytesPerRecord = 97.1
	// natsBytesPerRecord is the stream bytes of a done record without
	// data, as natsstore's TestBytesPerRecord measured them (its README,
	// "Bytes per record").
	natsBytesPerRecord = 137.4
)

// figure is what window knows of a store's bytes a record.
type figure struct {
	store   string
	compact bool    // Redis with CompactKeys
	bytes   float64 // 0: unknown
	source  string  // where bytes comes from, or how to give it
}

// noFigure is the source of a store without a benchmark figure.
const noFigure = "no benchmark figure for %s: give -bytes-per-record (dedupctl stats on a table of representative records prints its bytes a record)"

// figures is every store's, in the order window prints them.
func figures() []figure {
	return []figure{
		{store: storeMemory, bytes: memoryBytesPerRecord, source: "memstore, BENCHMARKS.md"},
		{store: storeRedis, bytes: redisBytesPerRecord, source: "Redis, default layout, BENCHMARKS.md"},
		{store: storeRedis, compact: true, bytes: redisCompactBytesPerRecord, source: "Redis with CompactKeys, BENCHMARKS.md"},
		{store: storePostgres, bytes: postgresBytesPerRecord, source: "PostgreSQL, BENCHMARKS.md"},
		// A NATS bucket keeps every record for its MaxAge, about the
		// retention (max(MaxRetention, 2 x MaxLease) + ClockSkew).
		{store: storeNATS, bytes: natsBytesPerRecord, source: "NATS stream bytes, stores/natsstore/README.md (the disk holds about 2.6 times that)"},
		{store: storeMySQL, source: fmt.Sprintf(noFigure, storeMySQL)},
		{store: storeSQLite, source: fmt.Sprintf(noFigure, storeSQLite)},
	}
}

// windowStores are the names -store takes for window.
var windowStores = append([]string{storeMemory}, storeNames...)

// checkWindow checks window's flags.
func (c *config) checkWindow() error {
	switch {
	case c.horizon == 0 && !c.horizonSet:
		return usagef("window needs -horizon, the broker's longest redelivery horizon (such as -horizon=24h)")
	case c.horizon <= 0:
		return usagef("-horizon must be positive, got %s: the broker's longest redelivery horizon (such as -horizon=24h)", c.horizon)
	case float64(c.horizon)*dedup.RetentionSafetyFactor >= math.MaxInt64:
		return usagef("-horizon %s is too long: %.1f times it is no duration", c.horizon, dedup.RetentionSafetyFactor)
	case c.rate < 0 || math.IsInf(c.rate, 0) || math.IsNaN(c.rate):
		return usagef("-rate must be positive, got %v: messages per second (such as -rate=500)", c.rate)
	case c.keysPerMessage < 1:
		return usagef("-keys-per-message must be at least 1, got %d", c.keysPerMessage)
	case c.bytesPerRecord < 0 || math.IsInf(c.bytesPerRecord, 0) || math.IsNaN(c.bytesPerRecord):
		return usagef("-bytes-per-record must be positive, got %v", c.bytesPerRecord)
	}
	if c.store != "" && !slices.Contains(windowStores, c.store) {
		return usagef("unknown store %q: -store must be one of %s", c.store, strings.Join(windowStores, ", "))
	}
	// The records and bytes must be figures, not +Inf.
	records := c.rate * (float64(c.horizon) * dedup.RetentionSafetyFactor / float64(time.Second)) * float64(c.keysPerMessage)
	switch {
	case records > maxWindowRecords:
		return usagef("-rate %v over -horizon %s is more than %g records: no store holds that window", c.rate, c.horizon, maxWindowRecords)
	case records*c.bytesPerRecord > maxWindowRecords*1e6:
		return usagef("-bytes-per-record %v over %g records is more bytes than any store holds", c.bytesPerRecord, records)
	}
	return nil
}

// maxWindowRecords bounds the window the calculator sizes, well inside a
// float64's exact range of figures people read.
const maxWindowRecords = 1e18

// windowFigures are the figures window sizes the storage with: the one
// -bytes-per-record gives, the one of the store -store names, or every
// store's.
func windowFigures(c *config) []figure {
	if c.bytesPerRecord > 0 {
		return []figure{{store: c.store, compact: c.store == storeRedis && c.settings.Redis.CompactKeys, bytes: c.bytesPerRecord, source: "-bytes-per-record"}}
	}
	all := figures()
	if c.store == "" {
		return all
	}
	for _, f := range all {
		if f.store == c.store && f.compact == (c.store == storeRedis && c.settings.Redis.CompactKeys) {
			return []figure{f}
		}
	}
	// A store registered in storeopen without a figure here: the window
	// says how to give one.
	return []figure{{store: c.store, source: fmt.Sprintf(noFigure, c.store)}}
}

// windowView is window's answer.
type windowView struct {
	Horizon        string  `json:"horizon"`
	Factor         float64 `json:"factor"`
	Retention      string  `json:"retention"`
	RetentionSec   float64 `json:"retention_seconds"`
	Rate           float64 `json:"rate"`
	KeysPerMessage int     `json:"keys_per_message"`
	// Records and Storage are 0 and empty without -rate.
	Records float64         `json:"records"`
	Storage []windowStorage `json:"storage"`
}

// windowStorage is the storage of one store.
type windowStorage struct {
	// Store is empty for -bytes-per-record without -store.
	Store       string `json:"store,omitempty"`
	CompactKeys bool   `json:"compact_keys,omitempty"`
	// BytesPerRecord and Bytes are absent for a store without a figure:
	// Source then says how to give one.
	BytesPerRecord *float64 `json:"bytes_per_record,omitempty"`
	Bytes          *float64 `json:"bytes,omitempty"`
	Source         string   `json:"source"`
}

func (c *cli) window() error {
	h := c.cfg.horizon
	// RetentionSafetyFactor x the horizon as dedup.CheckHorizon
	// computes it, rounded up to a second.
	minimum := time.Duration(float64(h) * dedup.RetentionSafetyFactor)
	retention := minimum.Truncate(time.Second)
	if retention < minimum {
		retention += time.Second
	}
	w := windowView{
		Horizon:        h.String(),
		Factor:         dedup.RetentionSafetyFactor,
		Retention:      retention.String(),
		RetentionSec:   retention.Seconds(),
		Rate:           c.cfg.rate,
		KeysPerMessage: c.cfg.keysPerMessage,
		Storage:        []windowStorage{},
	}
	if c.cfg.rate > 0 {
		records := c.cfg.rate * float64(c.cfg.keysPerMessage) * retention.Seconds()
		w.Records = math.Ceil(records)
		for _, f := range windowFigures(c.cfg) {
			s := windowStorage{Store: f.store, CompactKeys: f.compact, Source: f.source}
			if f.bytes > 0 {
				bpr, bytes := f.bytes, math.Ceil(records*f.bytes)
				s.BytesPerRecord, s.Bytes = &bpr, &bytes
			}
			w.Storage = append(w.Storage, s)
		}
	}
	if c.cfg.json {
		return writeJSON(c.out, w)
	}
	writeWindow(c.out, w)
	return nil
}

// name is the row's store as the flags name it.
func (s windowStorage) name() string {
	switch {
	case s.Store == "":
		return "-bytes-per-record"
	case s.CompactKeys:
		return s.Store + " -compact-keys"
	}
	return s.Store
}

func writeWindow(w io.Writer, v windowView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "retention\t%s\t(%.1f x redelivery horizon %s): set Config.Retention to at least this\n", v.Retention, v.Factor, v.Horizon)
	if v.Rate == 0 {
		tw.Flush()
		fmt.Fprintf(w, "\nstorage: add -rate (messages a second) to size it, and -store or -bytes-per-record for one store only\n")
		return
	}
	fmt.Fprintf(tw, "records\t%s\t(%g messages/s x %d %s x %s)\n", thousands(v.Records), v.Rate, v.KeysPerMessage, plural(v.KeysPerMessage, "key", "keys"), v.Retention)
	if len(v.Storage) == 1 {
		s := v.Storage[0]
		if s.BytesPerRecord == nil {
			fmt.Fprintf(tw, "storage\tunknown\t(%s)\n", s.Source)
		} else {
			fmt.Fprintf(tw, "bytes a record\t%g\t(%s; records without data: add what a fingerprint and stored outputs take)\n", *s.BytesPerRecord, s.Source)
			fmt.Fprintf(tw, "storage\t%s\t(%s bytes)\n", fmtBytes(*s.Bytes), thousands(*s.Bytes))
		}
		tw.Flush()
		return
	}
	tw.Flush()
	fmt.Fprintf(w, "\nstorage by store (records without data: add what a fingerprint and stored outputs take):\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STORE\tBYTES A RECORD\tSTORAGE\tSOURCE")
	for _, s := range v.Storage {
		if s.BytesPerRecord == nil {
			fmt.Fprintf(tw, "%s\t?\t?\t%s\n", s.name(), s.Source)
			continue
		}
		fmt.Fprintf(tw, "%s\t%g\t%s (%s bytes)\t%s\n", s.name(), *s.BytesPerRecord, fmtBytes(*s.Bytes), thousands(*s.Bytes), s.Source)
	}
	tw.Flush()
}
