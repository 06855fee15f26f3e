package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/watermill-dedup/dedup/internal/record"
	"github.com/watermill-dedup/dedup/stores"
)

// recordJSON is a record as dedupctl shows it: its data decoded as the
// middleware wrote it.
type recordJSON struct {
	// Scope and Key are absent when the store does not know them.
	Scope      *string    `json:"scope,omitempty"`
	Key        *string    `json:"key,omitempty"`
	ID         string     `json:"id"`
	State      string     `json:"state"`
	Token      string     `json:"token,omitempty"`
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	Expired    bool       `json:"expired"`
	DataBytes  int        `json:"data_bytes"`
	// Fingerprint (hexadecimal) and Outputs are a done record's, decoded
	// by record.Inspect; DataError says why its data did
	// not decode.
	Fingerprint string `json:"fingerprint,omitempty"`
	Outputs     *int   `json:"outputs,omitempty"`
	DataError   string `json:"data_error,omitempty"`
	// TraceID and SpanID are the span of the run that completed a done
	// record, or that claimed a processing one, kept when its tracing
	// linked runs (dedup.Tracing.LinkRuns).
	TraceID string `json:"trace_id,omitempty"`
	SpanID  string `json:"span_id,omitempty"`
}

func recordView(r stores.Record) recordJSON {
	v := recordJSON{ID: r.ID, State: r.State.String(), Token: r.Token, Expired: r.Expired, DataBytes: len(r.Data)}
	if r.ScopeKnown {
		v.Scope = &r.Scope
	}
	if r.KeyKnown {
		v.Key = &r.Key
	}
	if !r.LeaseUntil.IsZero() {
		t := r.LeaseUntil.UTC()
		v.LeaseUntil = &t
	}
	if !r.ExpiresAt.IsZero() {
		t := r.ExpiresAt.UTC()
		v.ExpiresAt = &t
	}
	if run, ok := record.ParseRun(r.Owner); ok && r.State == stores.StateProcessing {
		v.TraceID, v.SpanID = run.TraceID().String(), run.SpanID().String()
	}
	if r.State == stores.StateDone {
		info, err := record.Inspect(r.Data)
		if err != nil {
			v.DataError = err.Error()
		} else {
			v.Fingerprint, v.Outputs = info.FingerprintHex(), &info.Outputs
			if info.Run.IsValid() {
				v.TraceID, v.SpanID = info.Run.TraceID().String(), info.Run.SpanID().String()
			}
		}
	}
	return v
}

func views(recs []stores.Record) []recordJSON {
	out := make([]recordJSON, len(recs))
	for i, r := range recs {
		out[i] = recordView(r)
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// fmtTime is t in UTC, to the second, and how far from now it is.
func fmtTime(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now).Round(time.Second)
	rel := "now"
	switch {
	case d > 0:
		rel = "in " + d.String()
	case d < 0:
		rel = (-d).String() + " ago"
	}
	return t.UTC().Format(time.RFC3339) + " (" + rel + ")"
}

// describe is a record on one line.
func describe(r recordJSON, now time.Time) string {
	var b strings.Builder
	if r.Scope != nil {
		fmt.Fprintf(&b, "scope %+q ", *r.Scope)
	}
	if r.Key != nil {
		fmt.Fprintf(&b, "key %+q ", *r.Key)
	}
	fmt.Fprintf(&b, "(id %s): %s", r.ID, r.State)
	if r.LeaseUntil != nil {
		fmt.Fprintf(&b, ", token %s, lease until %s", r.Token, fmtTime(*r.LeaseUntil, now))
	}
	if r.ExpiresAt != nil {
		fmt.Fprintf(&b, ", expires at %s", fmtTime(*r.ExpiresAt, now))
	}
	if r.Expired {
		b.WriteString(", expired")
	}
	return b.String()
}

// writeRecord writes one record, a line a field.
func writeRecord(w io.Writer, r stores.Record, now time.Time) {
	v := recordView(r)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	switch {
	case v.Scope == nil && v.Key == nil:
		row("scope, key", notStored)
	case v.Scope == nil:
		row("scope", notStored)
		row("key", strconv.QuoteToASCII(*v.Key))
	case v.Key == nil:
		row("scope", strconv.QuoteToASCII(*v.Scope))
		row("key", notStored)
	default:
		row("scope", strconv.QuoteToASCII(*v.Scope))
		row("key", strconv.QuoteToASCII(*v.Key))
	}
	row("id", v.ID)
	row("state", v.State)
	if r.State == stores.StateProcessing {
		row("token", v.Token)
		if v.TraceID != "" {
			row("claimed by", fmt.Sprintf("trace %s, span %s", v.TraceID, v.SpanID))
		}
		lease := fmtTime(r.LeaseUntil, now)
		if r.Expired {
			lease += ", ran out: the next delivery takes the claim over"
		}
		row("lease until", lease)
		return
	}
	exp := fmtTime(r.ExpiresAt, now)
	if r.Expired {
		exp += ", expired: the next delivery runs the handler again"
	}
	row("expires at", exp)
	switch {
	case v.DataError != "":
		row("data", fmt.Sprintf("%d bytes, not the middleware's: %s", v.DataBytes, v.DataError))
	default:
		fp := "none"
		if v.Fingerprint != "" {
			fp = fmt.Sprintf("%s (%d bytes)", v.Fingerprint, len(v.Fingerprint)/2)
		}
		row("fingerprint", fp)
		row("outputs", strconv.Itoa(*v.Outputs))
		if v.TraceID != "" {
			row("completed by", fmt.Sprintf("trace %s, span %s", v.TraceID, v.SpanID))
		}
		row("data", fmt.Sprintf("%d bytes", v.DataBytes))
	}
}

// writeRecords writes records as a table: by scope and key where the
// store knows them, with their ID where it does not know every key.
func writeRecords(w io.Writer, recs []stores.Record, now time.Time) {
	writeRecordTable(w, recs, now, false)
}

// writeRecordTable is writeRecords, with the ID column always when
// withID.
func writeRecordTable(w io.Writer, recs []stores.Record, now time.Time, withID bool) {
	scoped, keyed := false, !withID
	for _, r := range recs {
		scoped = scoped || r.ScopeKnown
		keyed = keyed && r.KeyKnown
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	var head []string
	if scoped {
		head = append(head, "SCOPE", "KEY")
	}
	head = append(head, "STATE", "UNTIL", "TOKEN", "FINGERPRINT", "OUTPUTS")
	if !keyed {
		head = append(head, "ID")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range recs {
		v := recordView(r)
		var cols []string
		if scoped {
			cols = append(cols, quoteOr(v.Scope), quoteOr(v.Key))
		}
		until := r.LeaseUntil
		if r.State == stores.StateDone {
			until = r.ExpiresAt
		}
		state := v.State
		if r.Expired {
			state += " (expired)"
		}
		fp, outputs := "-", "-"
		if r.State == stores.StateDone {
			if v.Fingerprint != "" {
				fp = v.Fingerprint
			}
			if v.Outputs != nil {
				outputs = strconv.Itoa(*v.Outputs)
			} else {
				outputs = "? (" + v.DataError + ")"
			}
		}
		cols = append(cols, state, fmtTime(until, now), or(v.Token, "-"), fp, outputs)
		if !keyed {
			cols = append(cols, v.ID)
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
}

func quoteOr(s *string) string {
	if s == nil {
		return "?"
	}
	return strconv.QuoteToASCII(*s)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// statsJSON is stores.Stats for -json.
type statsJSON struct {
	Store string `json:"store"`
	countsJSON
	Bytes int64 `json:"bytes"`
	// PerScope is false where the layout keeps no scopes: Scopes is
	// then absent.
	PerScope bool        `json:"per_scope"`
	Scopes   []scopeJSON `json:"scopes,omitempty"`
	// Skipped counts the keys under the prefix that are not the store's
	// records, and SkippedSample shows a few.
	Skipped       int64    `json:"skipped"`
	SkippedSample []string `json:"skipped_sample,omitempty"`
}

// scopeJSON is the counts of one scope.
type scopeJSON struct {
	Scope string `json:"scope"`
	countsJSON
}

type countsJSON struct {
	Processing   int64      `json:"processing"`
	Done         int64      `json:"done"`
	Expired      int64      `json:"expired"`
	Total        int64      `json:"total"`
	OldestExpiry *time.Time `json:"oldest_expiry,omitempty"`
	NewestExpiry *time.Time `json:"newest_expiry,omitempty"`
}

func counts(c stores.Counts, oldest, newest time.Time) countsJSON {
	v := countsJSON{Processing: c.Processing, Done: c.Done, Expired: c.Expired, Total: c.Total()}
	if !oldest.IsZero() {
		o, n := oldest.UTC(), newest.UTC()
		v.OldestExpiry, v.NewestExpiry = &o, &n
	}
	return v
}

func statsView(where string, st stores.Stats) statsJSON {
	v := statsJSON{Store: where, countsJSON: counts(st.Counts, st.OldestExpiry, st.NewestExpiry), Bytes: st.Bytes, PerScope: st.PerScope,
		Skipped: st.Skipped, SkippedSample: st.SkippedSample}
	for _, sc := range st.Scopes {
		v.Scopes = append(v.Scopes, scopeJSON{sc.Scope, counts(sc.Counts, sc.OldestExpiry, sc.NewestExpiry)})
	}
	return v
}

func writeStats(w io.Writer, a *admin, st stores.Stats, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "store\t%s\n", a.where)
	fmt.Fprintf(tw, "records\t%d: %d processing, %d done, %d expired (not yet purged)\n", st.Total(), st.Processing, st.Done, st.Expired)
	if !st.OldestExpiry.IsZero() {
		fmt.Fprintf(tw, "expiry\toldest %s, newest %s\n", fmtTime(st.OldestExpiry, now), fmtTime(st.NewestExpiry, now))
	}
	switch {
	case st.Bytes < 0:
		fmt.Fprintf(tw, "size\tunknown (the backend does not tell)\n")
	case st.Total() > 0:
		fmt.Fprintf(tw, "size\tabout %s, %.1f bytes a record\n", fmtBytes(float64(st.Bytes)), float64(st.Bytes)/float64(st.Total()))
	default:
		fmt.Fprintf(tw, "size\tabout %s\n", fmtBytes(float64(st.Bytes)))
	}
	tw.Flush()
	defer writeSkipped(w, st.Skipped, st.SkippedSample)
	if !st.PerScope {
		fmt.Fprintf(w, "\nno counts by scope: %s\n", digestNote)
		return
	}
	if len(st.Scopes) == 0 {
		fmt.Fprintf(w, "\nno records: is this the store's prefix? (-redis-prefix, -run-id)\n")
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tPROCESSING\tDONE\tEXPIRED\tOLDEST EXPIRY\tNEWEST EXPIRY")
	for _, sc := range st.Scopes {
		fmt.Fprintf(tw, "%+q\t%d\t%d\t%d\t%s\t%s\n", sc.Scope, sc.Processing, sc.Done, sc.Expired, fmtTime(sc.OldestExpiry, now), fmtTime(sc.NewestExpiry, now))
	}
	tw.Flush()
}

// fmtBytes is n bytes with a decimal unit.
func fmtBytes(n float64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB"}
	i := 0
	for n >= 1000 && i < len(units)-1 {
		n /= 1000
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// thousands writes a whole number with commas between thousands.
func thousands(n float64) string {
	s := strconv.FormatFloat(n, 'f', 0, 64)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// writeSkipped writes the keys under the prefix that a stats passed over
// as not the store's records. Which program wrote them is not guessed:
// a guess from the key's shape took real records for another's (#7).
func writeSkipped(w io.Writer, n int64, sample []string) {
	if n <= 0 {
		return
	}
	eg := ""
	if len(sample) > 0 {
		quoted := make([]string, len(sample))
		for i, id := range sample {
			quoted[i] = `"` + id + `"`
		}
		eg = ", such as " + strings.Join(quoted, ", ")
	}
	fmt.Fprintf(w, "\nskipped %d %s under the prefix that %s not the store's records%s\n",
		n, plural(int(n), "key", "keys"), plural(int(n), "is", "are"), eg)
	fmt.Fprintln(w, "(another layout's: -compact-keys, -digest-keys-longer-than; another store's: -redis-prefix; or another program's)")
}

// notStored is the scope and key of a record found by its ID on a store
// that keeps a digest of them.
const notStored = "not stored: the store keeps a digest of (scope, key), which cannot be read back " +
	"(`dedupctl get SCOPE KEY` finds a record by them)"

// digestNote explains what a store keeping (scope, key) as a digest
// cannot do, and what works instead: one short line each.
const digestNote = "the store keeps each record under a digest of (scope, key), which cannot be read back:\n" +
	"  `dedupctl get SCOPE KEY` reads one record;\n" +
	"  `dedupctl list` (without SCOPE or -prefix) lists every record by id;\n" +
	"  -id=ID names one of them to get, forget or release"
