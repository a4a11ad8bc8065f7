package mesh

import (
	"strings"
	"testing"
)

func TestReplyAllowed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reply, own string
		want       bool
	}{
		{"_R_.a1B2c3.d4E5f6", "", true},
		{"_SLUICE_INBOX.ingest-result.abc.1", "", true},
		{"_SLUICE_INBOX.operator.xyz", "", true},
		{"_INBOX.abc.def", "", true},
		{"_INBOX_acme.abc", "_INBOX_acme", true},
		{"_INBOX_acme.abc", "_INBOX_globex", false},
		{"_INBOX_acme", "_INBOX_acme", false},
		{"", "", false},
		{"sluice.result.globex.01a2", "_INBOX_acme", false},
		{"$KV.budgets.fleet.key", "", false},
		{"$KV.fleet.key", "", false},
		{"sluice.dlq.globex.x", "", false},
		{"_R_", "", false},
		{"_R_.*", "", false},
		{"_R_.>", "", false},
		{"_R_..x", "", false},
		{"_R_.x.", "", false},
		{"_R_.a b", "", false},
		{"_R_.a\x00b", "", false},
		{"_R_." + strings.Repeat("x", 300), "", false},
	} {
		if got := ReplyAllowed(tc.reply, tc.own); got != tc.want {
			t.Errorf("ReplyAllowed(%q, %q) = %v, want %v", tc.reply, tc.own, got, tc.want)
		}
	}
}

func FuzzReplyAllowed(f *testing.F) {
	for _, s := range []string{"_R_.a.b", "_INBOX.x", "sluice.result.a.b", "_R_.*", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, reply string) {
		if !ReplyAllowed(reply, "") {
			return
		}
		if strings.ContainsAny(reply, " \t\r\n") || strings.Contains(reply, "..") || len(reply) > maxReply {
			t.Errorf("allowed %q", reply)
		}
		if !strings.HasPrefix(reply, ServiceImportReplyPrefix) && !strings.HasPrefix(reply, ServiceInboxRoot) && !strings.HasPrefix(reply, DefaultInboxPrefix) {
			t.Errorf("allowed %q outside the reply prefixes", reply)
		}
	})
}
