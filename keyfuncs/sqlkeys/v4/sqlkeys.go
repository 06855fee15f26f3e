package sqlkeys

import (
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/watermill-dedup/dedup/keyfuncs"
	"github.com/watermill-dedup/dedup/keyfuncs/internal/sqloffset"
)

// MetadataOffset is the metadata name under which SchemaAdapter carries a
// row's offset (decimal), as in keyfuncs/sqlkeys.
const MetadataOffset = sqloffset.Metadata

// SchemaAdapter is a watermill-sql v4 SchemaAdapter that carries each
// row's offset into the message's metadata (MetadataOffset), for
// [Offset]. It does everything else as the adapter it wraps. Use it in
// the subscriber's configuration:
//
//	SchemaAdapter: sqlkeys.SchemaAdapter{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}},
type SchemaAdapter struct {
	wsql.SchemaAdapter
}

// UnmarshalMessage implements wsql.SchemaAdapter.
func (a SchemaAdapter) UnmarshalMessage(params wsql.UnmarshalMessageParams) (wsql.Row, error) {
	r, err := a.SchemaAdapter.UnmarshalMessage(params)
	if err != nil || r.Msg == nil {
		return r, err
	}
	sqloffset.Set(r.Msg, r.Offset)
	return r, nil
}

// RequiresTransaction implements wsql.RequiresTransaction as the adapter
// it wraps does: watermill-sql v4 creates a topic's tables in a
// transaction (under an advisory lock, with DefaultPostgreSQLSchema) only
// when the subscriber's adapter says so, which an adapter that merely
// embeds another would not.
func (a SchemaAdapter) RequiresTransaction() bool {
	rt, ok := a.SchemaAdapter.(wsql.RequiresTransaction)
	return ok && rt.RequiresTransaction()
}

var _ wsql.RequiresTransaction = SchemaAdapter{}

// Offset keys a message by "topic/offset": its subscribe topic (from the
// router) and the offset of its row (from SchemaAdapter). The pair names
// one row, so it catches watermill-sql's redeliveries of it, not a
// producer that inserts the event again (a new row). A message without
// them gives an error wrapping keyfuncs.ErrNoKey.
func Offset() keyfuncs.KeyFunc { return sqloffset.Key() }
