package natsauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/nats-io/nkeys"
)

// SecretsFile is where the service identities live, under the data
// directory.
const SecretsFile = "secrets/nats-users.json"

// Secrets are the nkey seeds of the service identities, by role set
// (SetName). The file is the only place they exist: keep it private (mode
// 0600); processes joining the embedded server, and the CLI, read it from
// the same --data directory.
type Secrets struct {
	Note  string            `json:"note"`
	Seeds map[string]string `json:"nkey_seeds"`
}

// SecretsPath is the file's path under dataDir.
func SecretsPath(dataDir string) string { return filepath.Join(dataDir, SecretsFile) }

// LoadSecrets reads the file; an error matching fs.ErrNotExist when there
// is none. A file others may read is refused.
func LoadSecrets(dataDir string) (*Secrets, error) {
	path := SecretsPath(dataDir)
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("nats secrets %s: mode %v lets others read the service keys; run chmod 600 %s", path, st.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Secrets
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("nats secrets %s: %w", path, err)
	}
	for set, seed := range s.Seeds {
		if _, err := ParseSet(set); err != nil {
			return nil, fmt.Errorf("nats secrets %s: %w", path, err)
		}
		if _, err := nkeys.FromSeed([]byte(seed)); err != nil {
			return nil, fmt.Errorf("nats secrets %s: seed of %s: %w", path, set, err)
		}
	}
	return &s, nil
}

// EnsureSecrets loads the file, or creates it (directory 0700, file 0600),
// and adds a seed for every role set that has none.
func EnsureSecrets(dataDir string) (*Secrets, error) {
	s, err := LoadSecrets(dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		s, err = &Secrets{}, nil
	}
	if err != nil {
		return nil, err
	}
	if s.Seeds == nil {
		s.Seeds = map[string]string{}
	}
	changed := false
	for _, set := range AllSets() {
		if _, ok := s.Seeds[set]; ok {
			continue
		}
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, err
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, err
		}
		s.Seeds[set] = string(seed)
		changed = true
	}
	if !changed {
		return s, nil
	}
	s.Note = "Sluice's NATS service identities (nkey seeds), one per role set. Secret: keep this file at mode 0600."
	path := SecretsPath(dataDir)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("nats secrets: %w", err)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".nats-users-*.json")
	if err != nil {
		return nil, fmt.Errorf("nats secrets: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("nats secrets: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("nats secrets: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("nats secrets: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, fmt.Errorf("nats secrets: %w", err)
	}
	return s, nil
}

// KeyPair returns the identity of a role set.
func (s *Secrets) KeyPair(set string) (nkeys.KeyPair, error) {
	seed, ok := s.Seeds[set]
	if !ok {
		return nil, fmt.Errorf("no NATS identity for %q in %s; start the embedded server once to create it", set, SecretsFile)
	}
	return nkeys.FromSeed([]byte(seed))
}

// Public returns the public nkeys by role set, sorted by set name.
func (s *Secrets) Public() (sets []string, keys map[string]string, err error) {
	keys = map[string]string{}
	for set, seed := range s.Seeds {
		kp, err := nkeys.FromSeed([]byte(seed))
		if err != nil {
			return nil, nil, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, nil, err
		}
		keys[set] = pub
		sets = append(sets, set)
	}
	slices.Sort(sets)
	return sets, keys, nil
}
