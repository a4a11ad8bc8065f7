package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natsauth"
)

// runNATSAuth prints the nats-server accounts block for the current
// configuration: the service account with the service identities (created
// in --data when missing), and an account per tenant, so operators of an
// external NATS paste it.
func runNATSAuth(_ context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("nats-auth", stderr)
	cfgPath := fs.String("config", getenv("SLUICE_CONFIG"), "configuration: its tenants become NATS users (SLUICE_CONFIG)")
	data := fs.String("data", envOr(getenv, "SLUICE_DATA", "./data"), "directory for "+natsauth.SecretsFile+", the service identities; created when missing (SLUICE_DATA)")
	out := fs.String("out", "", "write the block to this file (replaced whole, mode 0644) instead of stdout: compose.yaml's nats-auth service writes it for the NATS nodes")
	sets := fs.String("sets", "", "role sets to print besides the operator, comma-separated, e.g. ingest-result,admission,executor (default: each service alone and all four together)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: sluice nats-auth [flags] > sluice-auth.conf   (or --out sluice-auth.conf)")
		fmt.Fprintln(fs.Output(), "Prints the nats-server `accounts` block for this configuration: account "+natsauth.ServiceAccount+" with JetStream and one nkey user")
		fmt.Fprintln(fs.Output(), "per service role set and the operator; one account per tenant with its user (password: bcrypt of its API key, read from")
		fmt.Fprintln(fs.Output(), "its api_key_env now), importing only its own subjects. No secret is printed.")
		fs.PrintDefaults()
	}
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	var list []string
	for _, s := range strings.Split(*sets, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if _, err := natsauth.ParseSet(s); err != nil {
			return fmt.Errorf("--sets: %w", err)
		}
		list = append(list, s)
	}
	sec, err := natsauth.EnsureSecrets(*data)
	if err != nil {
		return err
	}
	block, err := natsauth.AccountsBlock(cfg, sec, getenv, natsauth.BlockOptions{Sets: list})
	if err != nil {
		return err
	}
	if *out != "" {
		return writeFileAtomic(*out, []byte(block), 0o644)
	}
	_, err = io.WriteString(stdout, block)
	return err
}

// writeFileAtomic replaces path with data: a reader (a NATS node starting)
// sees the old file or the new one, never half of it.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
