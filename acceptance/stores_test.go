package acceptance_test

import (
	"testing"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// memStore is the in-process store: no network (no outage scenario), one
// process only.
func memStore() acceptance.Store {
	return acceptance.Store{
		Name: "memstore",
		Open: func(testing.TB, acceptance.Env) (acceptance.Opened, error) {
			s, err := memstore.New(memstore.Config{})
			return acceptance.Opened{Store: s}, err
		},
	}
}
