// Package clip shortens strings that a caller or a provider sent before
// they are quoted in an error message or a log line.
package clip

// String returns s cut to its first n bytes, with "…" appended when it
// was longer. It cuts bytes, not runes: a value that long was wrong
// anyway, and only its start is shown.
func String(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
