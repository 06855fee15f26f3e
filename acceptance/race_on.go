//go:build race

package acceptance

// raceDetector: the suite runs under the race detector (see
// Backend.RaceUnsafe).
const raceDetector = true
