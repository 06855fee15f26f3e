// The baseline of the postgres case: the same router and database/sql
// handle without the dedup packages.
package main

import (
	"context"
	"database/sql"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib"
)

func main() {
	logger := watermill.NewStdLogger(false, false)
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	db, err := sql.Open("pgx", os.Getenv("POSTGRES_DSN"))
	if err != nil {
		panic(err)
	}
	defer db.Close()

	router.AddConsumerHandler("orders", "orders", pubSub, func(msg *message.Message) error {
		_, err := db.ExecContext(msg.Context(), `UPDATE totals SET n = n + 1`)
		return err
	})
	if err := router.Run(context.Background()); err != nil {
		panic(err)
	}
}
