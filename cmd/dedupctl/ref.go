package main

import (
	"context"
	"fmt"

	"github.com/watermill-dedup/dedup/stores"
)

// recordRef is the record that get, forget or release names: by SCOPE KEY, or
// by -id.
type recordRef struct{ scope, key, id string }

func (o recordRef) String() string {
	if o.id != "" {
		return "with id " + o.id
	}
	return fmt.Sprintf("for key %+q in scope %+q", o.key, o.scope)
}

func (o recordRef) get(ctx context.Context, a *admin) (stores.Record, error) {
	if o.id != "" {
		return a.GetByID(ctx, o.id)
	}
	return a.Get(ctx, o.scope, o.key)
}

func (o recordRef) delete(ctx context.Context, a *admin, want stores.RecordState) (stores.Record, error) {
	if o.id != "" {
		return a.DeleteByID(ctx, o.id, want)
	}
	return a.Delete(ctx, o.scope, o.key, want)
}
