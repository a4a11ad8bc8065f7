package clip

import "testing"

func TestString(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"", 4, ""},
		{"abcd", 4, "abcd"},
		{"abcde", 4, "abcd…"},
		{"sk-secret", 4, "sk-s…"},
	} {
		if got := String(tc.s, tc.n); got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}
