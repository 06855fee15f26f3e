package acceptance_test

import (
	"testing"

	"github.com/watermill-dedup/dedup/acceptance"
	"github.com/watermill-dedup/dedup/stores/sqlstore"
)

func allStores() []acceptance.Store {
	return []acceptance.Store{
		memStore(),
		redisStore(),
		sqlStore(sqlstore.SQLite, false),
		sqlStore(sqlstore.SQLite, true),
		sqlStore(sqlstore.Postgres, false),
		sqlStore(sqlstore.Postgres, true),
		sqlStore(sqlstore.MySQL, false),
		sqlStore(sqlstore.MySQL, true),
	}
}

var storeScenarios = []acceptance.Scenario{
	acceptance.NackRedelivery,
	acceptance.ConsumerCrash,
	acceptance.ConcurrentDuplicates,
	acceptance.ProducerRepublish,
	acceptance.StoreOutage,
}

func TestAcceptance(t *testing.T) {
	acceptance.Run(t, goChannel(), memStore())
	acceptance.Run(t, kafkaFake(), memStore())
	acceptance.Run(t, rabbitMQ(), memStore())
	acceptance.Run(t, sqlPubSub(sqlstore.Postgres), sqlStore(sqlstore.Postgres, true))
	acceptance.Run(t, sqlPubSub(sqlstore.MySQL), sqlStore(sqlstore.MySQL, true))
	acceptance.Run(t, kafkaFake(), redisStore())
	acceptance.Run(t, rabbitMQ(), redisStore())
	for _, s := range allStores()[1:] {
		acceptance.Run(t, goChannel(), s, storeScenarios...)
	}
}
