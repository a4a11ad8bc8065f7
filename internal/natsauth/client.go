package natsauth

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/config"
)

// FromEnv overrides the server.nats section with SLUICE_NATS_* variables:
// CREDS, NKEY_SEED_FILE, USER, CA, CERT, KEY (file names and a user name,
// not secrets). The password and token are read from the variables that
// password_env and token_env name, SLUICE_NATS_PASSWORD and
// SLUICE_NATS_TOKEN by default.
func FromEnv(n config.NATS, getenv func(string) string) config.NATS {
	for _, e := range []struct {
		name string
		dst  *string
	}{
		{"SLUICE_NATS_CREDS", &n.Creds}, {"SLUICE_NATS_NKEY_SEED_FILE", &n.NkeySeedFile}, {"SLUICE_NATS_USER", &n.User},
		{"SLUICE_NATS_CA", &n.TLS.CA}, {"SLUICE_NATS_CERT", &n.TLS.Cert}, {"SLUICE_NATS_KEY", &n.TLS.Key},
	} {
		if v := getenv(e.name); v != "" {
			*e.dst = v
		}
	}
	return n
}

// Identity says how a process authenticated, for logs.
type Identity struct {
	Method string // "creds", "nkey seed file", "user", "token", "service nkey", "none"
	Set    string // the role set, when known
}

func (i Identity) String() string {
	if i.Set != "" {
		return i.Method + " (" + i.Set + ")"
	}
	return i.Method
}

// Conn is how to connect: for a role set (SetName of the services a process
// runs, or Operator for the CLI).
type Conn struct {
	Config  *config.Config // server.nats (after FromEnv)
	DataDir string         // where secrets/nats-users.json may be
	Getenv  func(string) string
	Set     string
	// Embedded is the listener's TLS when the process dials its own
	// embedded server: its certificate is trusted when no CA is given.
	Embedded bool
	// InProcess: the connection is a pipe to the embedded server inside
	// this process (nats.InProcessServer). It authenticates as any other,
	// and its permissions hold, but it never leaves the process: there is
	// nothing for TLS to protect, and the server does not ask for it.
	InProcess bool
}

// Options returns the nats.Options that authenticate and secure the
// connection. In order: an identity configured in server.nats (or
// SLUICE_NATS_*), else the role set's nkey from the data directory's
// secrets file, else none.
func (c Conn) Options() ([]nats.Option, Identity, error) {
	getenv := c.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	n := FromEnv(c.Config.Server.NATS, getenv)
	var opts []nats.Option
	id := Identity{Method: "none"}
	passEnv, tokenEnv := or(n.PasswordEnv, "SLUICE_NATS_PASSWORD"), or(n.TokenEnv, "SLUICE_NATS_TOKEN")
	switch {
	case n.Creds != "":
		opts, id = append(opts, nats.UserCredentials(n.Creds)), Identity{Method: "creds"}
	case n.NkeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(n.NkeySeedFile)
		if err != nil {
			return nil, id, fmt.Errorf("server.nats.nkey_seed_file: %w", err)
		}
		opts, id = append(opts, o), Identity{Method: "nkey seed file"}
	case n.User != "":
		pass := getenv(passEnv)
		if pass == "" {
			return nil, id, fmt.Errorf("server.nats.user %q: the password variable %s is unset or empty", n.User, passEnv)
		}
		opts, id = append(opts, nats.UserInfo(n.User, pass)), Identity{Method: "user"}
	case getenv(tokenEnv) != "":
		opts, id = append(opts, nats.Token(getenv(tokenEnv))), Identity{Method: "token"}
	case n.TokenEnv != "":
		return nil, id, fmt.Errorf("server.nats.token_env: %s is unset or empty", n.TokenEnv)
	default:
		sec, err := LoadSecrets(c.DataDir)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return nil, id, err
		}
		kp, err := sec.KeyPair(c.Set)
		if err != nil {
			return nil, id, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, id, err
		}
		opts = append(opts, nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(ServiceInboxPrefix(c.Set)))
		id = Identity{Method: "service nkey", Set: c.Set}
	}
	if id.Method != "none" && id.Set == "" && c.Set != "" {
		// A configured identity is expected to hold the permissions
		// `sluice nats-auth` prints for this role set, inbox included.
		opts = append(opts, nats.CustomInboxPrefix(ServiceInboxPrefix(c.Set)))
	}
	if c.InProcess {
		return opts, id, nil
	}
	tc, err := c.tlsConfig(n)
	if err != nil {
		return nil, id, err
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	return opts, id, nil
}

// tlsConfig is the client side: the CA (server.nats.tls.ca, or for the
// embedded server its own certificate), and a client certificate.
func (c Conn) tlsConfig(n config.NATS) (*tls.Config, error) {
	ca := n.TLS.CA
	if ca == "" && c.Embedded {
		// Trust the listener's own certificate (its ca, if any, is for
		// client certificates).
		ca = n.ListenTLS.Cert
	}
	if ca == "" && n.TLS.Cert == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		data, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("nats tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("nats tls ca %s: no PEM certificate in it", ca)
		}
		tc.RootCAs = pool
		if c.Embedded && ca == n.ListenTLS.Cert {
			// Dialling 127.0.0.1 with a certificate that names only
			// hosts: verify it against its first name.
			if blk, _ := pemBlock(data); blk != nil && len(blk.IPAddresses) == 0 && len(blk.DNSNames) > 0 {
				tc.ServerName = blk.DNSNames[0]
			}
		}
	}
	cert, key := n.TLS.Cert, n.TLS.Key
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("nats tls client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	return tc, nil
}

func pemBlock(data []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, errors.New("no PEM block")
	}
	return x509.ParseCertificate(b.Bytes)
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// RedactURL drops credentials (user, password or token) from a
// comma-separated list of NATS URLs, for logs and messages.
func RedactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			if strings.Contains(p, "@") {
				parts[i] = "(unparsable URL)"
			}
			continue
		}
		if u.User != nil {
			u.User = url.User("REDACTED")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}
