package prommetrics_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	dedup "github.com/watermill-dedup/dedup"
	"github.com/watermill-dedup/dedup/middleware"
	"github.com/watermill-dedup/dedup/prommetrics"
	"github.com/watermill-dedup/dedup/stores/memstore"
)

// Wire the adapter into the middleware; serve reg with promhttp.HandlerFor.
func ExampleNew() {
	reg := prometheus.NewRegistry()
	metrics, err := prommetrics.New(prommetrics.Config{Registerer: reg})
	if err != nil {
		panic(err)
	}
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close(context.Background())
	dedupMW, err := middleware.New(middleware.Config{Store: store, Scope: "loyalty", Policy: dedup.Policy{Metrics: metrics}})
	if err != nil {
		panic(err)
	}

	handler := dedupMW.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msg := message.NewMessage("evt-1", []byte(`{}`))
	for range 2 { // a delivery and its redelivery
		if _, err := handler(msg); err != nil {
			panic(err)
		}
	}
	n, _ := testutil.GatherAndCount(reg, "dedup_outcomes_total")
	fmt.Println("outcome series:", n)
	// Output:
	// outcome series: 13
}
