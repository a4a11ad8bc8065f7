package systest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// One node reloaded again and again while chat completions run through
// it (each reload changes a limit, adds or removes a tenant): every call
// succeeds, and the reloads apply in order. Under -race it checks that
// the services read the configuration while it is replaced without a race.
func TestReloadUnderLoad(t *testing.T) {
	t.Parallel()
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "m", RPM: 100_000, TPM: 10_000_000}},
		TTFT: 20 * time.Millisecond, APIKeys: []string{"sim-secret"}})
	var mu sync.Mutex
	version := 0
	yamlOf := func(v int) string {
		extra := ""
		if v%2 == 1 {
			extra = "  - {name: hooli, api_key_env: INITECH_KEY, max_concurrency: 4}\n"
		}
		return fmt.Sprintf(`providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: m, rpm: %d, tpm: 1000000, max_concurrency: %d}
tenants:
  - {name: acme, api_key_env: ACME_KEY, max_concurrency: %d}
%s`, simURL, 10_000+v, 8+v, 4+v, extra)
	}
	load := func() (*config.Config, string, error) {
		mu.Lock()
		defer mu.Unlock()
		c, err := config.Parse([]byte(yamlOf(version)))
		if err != nil {
			return nil, "", err
		}
		c.Server.Metrics = "127.0.0.1:0" // as StartWith sets it
		return c, fmt.Sprint(version), nil
	}
	reloads := make(chan string)
	var log SyncBuffer
	n := StartWith(t, yamlOf(0), Setup{Env: Env, Log: &log, Level: slog.LevelInfo, Load: load, Reloads: reloads})
	WaitReady(t, n.HTTP)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 4 {
		wg.Go(func() {
			for i := range 8 {
				if err := chat(ctx, n, fmt.Sprintf("worker %d call %d", w, i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for v := 1; v <= 6; v++ {
		mu.Lock()
		version = v
		mu.Unlock()
		select {
		case reloads <- "test":
		case <-ctx.Done():
			t.Fatal("the node did not take a reload request")
		}
		natstest.Eventually(t, 20*time.Second, func() error {
			if !strings.Contains(log.String(), fmt.Sprintf(`"msg":"configuration reloaded","source":"test","hash":"%d"`, v)) {
				return fmt.Errorf("reload %d not applied yet", v)
			}
			return nil
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// chat makes one chat completion as acme; an error unless it is answered 200.
func chat(ctx context.Context, n Node, prompt string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.HTTP+"/v1/chat/completions",
		bytes.NewReader([]byte(fmt.Sprintf(`{"model":"m","max_tokens":20,"messages":[{"role":"user","content":%q}]}`, prompt))))
	req.Header.Set("Authorization", "Bearer "+Env["ACME_KEY"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s", prompt, resp.StatusCode, body)
	}
	return nil
}
