package keyfuncs_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/dedup/keyfuncs"
)

// Dedup on both the message id and the business key: a broker redelivery
// repeats the id, a producer retry repeats the payment.
func ExampleAll() {
	key := keyfuncs.All(
		keyfuncs.Prefix("msg:", keyfuncs.MessageID()),
		keyfuncs.Prefix("payment:", keyfuncs.JSON("payment_id", "operation")),
	)
	msg := message.NewMessage("5b0e6c1e", []byte(`{"payment_id":"PAY-4812","operation":"capture","amount":120}`))
	keys, err := key(msg)
	fmt.Println(keys, err)
	// Output: [msg:5b0e6c1e payment:PAY-4812:capture] <nil>
}

func ExampleJSON_missingField() {
	key := keyfuncs.JSON("payment_id")
	_, err := key(message.NewMessage("m-1", []byte(`{"amount":120}`)))
	fmt.Println(err)
	// Output: no dedup key: message m-1: JSON field "payment_id" is missing
}
