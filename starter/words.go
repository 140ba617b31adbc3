package main

import "fmt"

// count is n things in English: "1 guest", "0 guests", "2 guests".
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
