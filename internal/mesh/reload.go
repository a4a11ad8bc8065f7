package mesh

// A reload is asked of the fleet on ReloadSubject (by `sluice reload`, or
// by the process a SIGHUP or POST /admin/reload reached, once it applied
// its own); every process re-reads its own configuration file, applies it
// or keeps the old one, and reports on ReloadedSubject.
const (
	ReloadSubject   = "sluice.signal.reload"
	ReloadedSubject = "sluice.signal.reloaded"
)

// ReloadNotice asks every process to reload.
type ReloadNotice struct {
	ID   string `json:"id"`             // names the reports that answer it
	From string `json:"from,omitempty"` // the process that sent it (it does not reload again)
	Hash string `json:"hash,omitempty"` // the sender's file hash, for the logs
}

// ReloadReport is one process's outcome.
type ReloadReport struct {
	ID       string `json:"id"`
	Process  string `json:"process"`  // host-pid
	Services string `json:"services"` // what it runs
	// Hash is the file hash in effect after the reload (the old one when
	// refused).
	Hash      string   `json:"hash"`
	Applied   bool     `json:"applied"`
	Unchanged bool     `json:"unchanged,omitempty"`
	Changed   []string `json:"changed,omitempty"` // the keys applied
	Error     string   `json:"error,omitempty"`   // why it kept the old one
}
