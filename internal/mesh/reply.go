package mesh

import "strings"

// Reply-subject prefixes a service answers on.
const (
	// ServiceImportReplyPrefix starts the reply subjects nats-server makes
	// for a request that crossed a service import: a tenant's request
	// reaches Sluice's account with one, and the answer is mapped back
	// into the tenant's own account, whatever reply the tenant chose.
	ServiceImportReplyPrefix = "_R_."
	// ServiceInboxRoot starts the reply inboxes of Sluice's own identities
	// (services and operator: _SLUICE_INBOX.<role set>).
	ServiceInboxRoot = "_SLUICE_INBOX."
	// DefaultInboxPrefix is nats.go's default inbox: connections without
	// an identity (a node or CLI with NATS authentication off) use it.
	DefaultInboxPrefix = "_INBOX."
	// maxReply bounds a reply subject; real ones are under 100 bytes.
	maxReply = 256
)

// ReplyAllowed reports whether a service may answer a request on reply:
// a well-formed subject under a service import's reply prefix, Sluice's
// own inboxes, nats.go's default inbox, or ownInbox (the requesting
// tenant's inbox prefix, client.InboxPrefix; "" for none). Anything else
// is a reply aimed elsewhere (another tenant's results, a bucket's keys):
// answering it would publish there with the service's rights, so the
// request is dropped. The account boundary already maps a tenant's reply
// to a service-import reply; this holds where it is missing (a shared
// account, a misconfigured server).
func ReplyAllowed(reply, ownInbox string) bool {
	if reply == "" || len(reply) > maxReply || !validSubject(reply) {
		return false
	}
	for _, p := range []string{ServiceImportReplyPrefix, ServiceInboxRoot, DefaultInboxPrefix} {
		if strings.HasPrefix(reply, p) {
			return true
		}
	}
	return ownInbox != "" && strings.HasPrefix(reply, ownInbox+".")
}

// validSubject: non-empty tokens, no wildcard, no white space or control
// character.
func validSubject(s string) bool {
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}
