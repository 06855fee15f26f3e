package middleware

import "encoding/hex"

// RecordDataInfo describes the data the middleware keeps on a done record
// (stores.Claim.Data, stores.Record.Data): the payload fingerprint, when
// Config.Fingerprint was set, and the messages the handler produced, which
// a redelivery re-emits.
type RecordDataInfo struct {
	// Fingerprint is the payload fingerprint kept with the record, nil
	// when none was.
	Fingerprint []byte
	// Outputs is the number of produced messages kept with the record.
	Outputs int
}

// FingerprintHex is the fingerprint in hexadecimal, "" when there is none.
func (i RecordDataInfo) FingerprintHex() string { return hex.EncodeToString(i.Fingerprint) }

// InspectRecordData decodes the data of a done record written by the
// middleware, for tools that show records to people (dedupctl). Empty
// data (a record without fingerprint or outputs) is the zero
// RecordDataInfo. Data the middleware did not write fails with an error
// wrapping ErrCorruptRecord.
func InspectRecordData(data []byte) (RecordDataInfo, error) {
	fp, msgs, err := decodeData(data)
	if err != nil {
		return RecordDataInfo{}, err
	}
	return RecordDataInfo{Fingerprint: fp, Outputs: len(msgs)}, nil
}
