package natsstore

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reading and writing records in the bucket: the subjects of a call's
// records and the order every call writes them in, the read of a key's
// last revision (a direct get, or the stream leader's), and the write
// conditional on the revision read.

// Headers the store writes.
const (
	hdrOperation = "KV-Operation" // a KV delete or purge marker
	opPurge      = "PURGE"
)

// record is one (scope, key) of a call.
type record struct {
	sh   *shard
	subj string
}

// records returns the records of keys in scope, once each, in the
// caller's order.
func (s *Store) records(scope string, keys []string) []record {
	out := make([]record, 0, len(keys))
	for _, k := range keys {
		d := digest(scope, k)
		sh := s.shards[shardOf(d, len(s.shards))]
		r := record{sh: sh, subj: sh.prefix + encodeKey(d)}
		if !slices.ContainsFunc(out, func(o record) bool { return o.subj == r.subj }) {
			out = append(out, r)
		}
	}
	return out
}

// subjects returns the subjects of recs in write order.
func subjects(recs []record) []string {
	out := make([]string, 0, len(recs))
	for _, i := range writeOrder(recs) {
		out = append(out, recs[i].subj)
	}
	return out
}

// writeOrder returns the indexes of recs in the order every call writes
// them: by subject, a total order all processes agree on.
func writeOrder(recs []record) []int {
	idx := make([]int, len(recs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case recs[a].subj < recs[b].subj:
			return -1
		case recs[a].subj > recs[b].subj:
			return 1
		}
		return 0
	})
	return idx
}

// read returns the latest revision of r.
//
// A single-replica bucket answers a direct get from its one server. A
// replicated one is read from its stream leader: a direct get may be
// answered by a follower that has not applied the last writes yet, and
// such a stale read would make a Complete right after its Claim find no
// record (ErrLostClaim), or a Claim miss a done record (the write that
// follows fails its revision check and the claim reads again, up to
// InProgress). Writes are safe either way: each is checked against the
// key's last revision by the leader.
func (s *Store) read(ctx context.Context, r record) (entry, error) {
	var (
		rev    uint64
		marker bool
		data   []byte
		err    error
	)
	if r.sh.leaderReads {
		rev, marker, data, err = s.leaderRead(ctx, r)
	} else {
		var m *jetstream.RawStreamMsg
		m, err = r.sh.stream.GetLastMsgForSubject(ctx, r.subj)
		if err == nil {
			rev, marker, data = m.Sequence, isMarker(m.Header), m.Data
		}
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, err
	}
	e := entry{rev: rev}
	if marker {
		return e, nil // a delete or purge marker
	}
	if err := decodeValue(&e, data); err != nil {
		return entry{}, fmt.Errorf("%w: subject %s, revision %d", err, r.subj, rev)
	}
	return e, nil
}

// msgGetResponse is the stream leader's answer to STREAM.MSG.GET.
type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Sequence uint64 `json:"seq"`
		Header   []byte `json:"hdrs,omitempty"`
		Data     []byte `json:"data,omitempty"`
	} `json:"message,omitempty"`
}

// leaderRead reads the last message of r from its stream's leader.
func (s *Store) leaderRead(ctx context.Context, r record) (rev uint64, marker bool, data []byte, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultRequestTimeout)
		defer cancel()
	}
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{r.subj})
	if err != nil {
		return 0, false, nil, err
	}
	m, err := s.nc.RequestWithContext(ctx, r.sh.msgGet, req)
	if err != nil {
		return 0, false, nil, err
	}
	var resp msgGetResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, false, nil, fmt.Errorf("natsstore: bad STREAM.MSG.GET reply: %w", err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, false, nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return 0, false, nil, fmt.Errorf("nats: %w", resp.Error)
	case resp.Message == nil:
		return 0, false, nil, errors.New("natsstore: empty STREAM.MSG.GET reply")
	}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return 0, false, nil, err
		}
		marker = isMarker(h)
	}
	return resp.Message.Sequence, marker, resp.Message.Data, nil
}

// write puts value under r, or a purge marker when value is nil, if the
// key's last revision is rev (0: the key has no message), and returns
// the new revision. Under TTLPerKey the message gets a TTL of its own:
// keep (how long from now the store contract needs the record) plus
// ClockSkew, at most maxTTL, or markerTTL for a marker.
func (s *Store) write(ctx context.Context, r record, value []byte, rev uint64, keep time.Duration) (uint64, error) {
	m := nats.NewMsg(r.subj)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	ttl := min(keep, maxTTL-s.cfg.ClockSkew) + s.cfg.ClockSkew
	if value == nil {
		m.Header.Set(hdrOperation, opPurge)
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		ttl = markerTTL
	} else {
		m.Data = value
	}
	if s.mode == TTLPerKey {
		m.Header.Set(jetstream.MsgTTLHeader, ttlSeconds(ttl))
	}
	ack, err := s.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// maxTTL caps a record's TTL: two of the longest leases. The server
// keeps its expiry in Unix nanoseconds, which a TTL of much more would
// overflow.
const maxTTL = 2 * MaxDurationLimit

// ttlSeconds is the Nats-TTL header of a TTL of d: whole seconds (the
// server's unit), rounded up, at least one, at most maxTTL.
func ttlSeconds(d time.Duration) string {
	secs := (min(max(d, 0), maxTTL) + time.Second - 1) / time.Second
	return strconv.FormatInt(int64(max(secs, 1)), 10)
}

// isMarker reports whether a message with headers h is no record: a KV
// delete or purge marker, or the marker the server leaves when a
// record's TTL (or MaxAge) removed it from a bucket with LimitMarkerTTL.
func isMarker(h nats.Header) bool {
	return h.Get(hdrOperation) != "" || h.Get(jetstream.MarkerReasonHeader) != ""
}

// newToken returns a fresh fencing token: 128 random bits.
func newToken() string { return rand.Text() }
