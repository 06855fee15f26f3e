package acceptance_test

import (
	"testing"

	"github.com/watermill-dedup/dedup/acceptance"
)

func TestAcceptance(t *testing.T) {
	acceptance.Run(t, goChannel(), memStore())
	acceptance.Run(t, kafkaFake(), memStore())
}
