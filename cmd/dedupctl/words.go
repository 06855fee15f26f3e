package main

import "strconv"

// argCount is "1 argument", "n arguments".
func argCount(n int) string { return strconv.Itoa(n) + " " + plural(n, "argument", "arguments") }

func plural(n int, singular, several string) string {
	if n == 1 {
		return singular
	}
	return several
}
