package sqlkeys

import (
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/internal/sqloffset"
)

// MetadataOffset is the metadata name under which SchemaAdapter carries a
// row's offset (decimal).
const MetadataOffset = sqloffset.Metadata

// SchemaAdapter is a watermill-sql SchemaAdapter that carries each row's
// offset into the message's metadata (MetadataOffset), for [Offset]. It
// does everything else as the adapter it wraps. Use it in the
// subscriber's configuration:
//
//	SchemaAdapter: sqlkeys.SchemaAdapter{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}},
type SchemaAdapter struct {
	wsql.SchemaAdapter
}

// UnmarshalMessage implements wsql.SchemaAdapter.
func (a SchemaAdapter) UnmarshalMessage(row wsql.Scanner) (wsql.Row, error) {
	r, err := a.SchemaAdapter.UnmarshalMessage(row)
	if err != nil || r.Msg == nil {
		return r, err
	}
	sqloffset.Set(r.Msg, r.Offset)
	return r, nil
}

// Offset keys a message by "topic/offset": its subscribe topic (from the
// router) and the offset of its row (from SchemaAdapter). The pair names
// one row, so it catches watermill-sql's redeliveries of it, not a
// producer that inserts the event again (a new row). A message without
// them gives an error wrapping keyfuncs.ErrNoKey.
//
// Offsets are the topic table's auto-increment column: they start again
// when the table is dropped and created again (or truncated with its
// identity restarted), and the new rows would then be duplicates of old
// records still within retention. Purge the scope's records (or use a new
// topic name) when you recreate a topic's table.
func Offset() keyfuncs.KeyFunc { return sqloffset.Key() }
