package localproxy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
)

// DaemonOptions configure a Daemon.
type DaemonOptions struct {
	// StateFile keeps instances across daemon restarts ("" keeps them in memory only).
	StateFile string
	// ProvisionDelay keeps new instances Provisioning this long before they listen, so
	// waits and deletes during provisioning can be exercised.
	ProvisionDelay time.Duration
	// AllowRemote lets proxies reach non-loopback targets.
	AllowRemote bool
	// DistinctEgress makes each instance connect to targets from a loopback address of
	// its own (EgressIP of its port), so a local site tells the proxies apart as a real
	// one tells real proxies apart by their IPs: a site that bans one proxy can be
	// tried on loopback. Linux only (other systems have 127.0.0.1 alone).
	DistinctEgress bool
	Log            *slog.Logger
	// OnChange, if set, is called (under the daemon's lock) after every create and delete
	// with the number of instances left: tests use it to prove make-before-break.
	OnChange func(op string, name string, live int)
}

// Daemon runs local proxy instances.
type Daemon struct {
	opts DaemonOptions
	log  *slog.Logger

	mu        sync.Mutex
	instances map[string]*instance
	closed    bool
}

type instance struct {
	info local.InstanceInfo
	// auth is what the proxy requires: kept here to be saved, never put in info.
	auth     *local.Auth
	proxy    *ForwardProxy
	server   *http.Server
	listener net.Listener
	ready    *time.Timer
}

// savedInstance is an instance as the state file keeps it: its info and the credentials it
// requires (the password's hash; the daemon is never given the password). A state file
// written before instances had credentials holds InstanceInfo objects alone, which parse
// as savedInstances without Auth.
type savedInstance struct {
	local.InstanceInfo
	RequiredAuth *local.Auth `json:"requiredAuth,omitempty"`
}

// errInvalid marks a request that can never succeed as it is (400 from the control API).
var errInvalid = errors.New("invalid request")

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// NewDaemon creates a daemon and restores the instances in its state file.
func NewDaemon(opts DaemonOptions) (*Daemon, error) {
	d := &Daemon{opts: opts, log: opts.Log, instances: map[string]*instance{}}
	if d.log == nil {
		d.log = slog.Default()
	}
	if opts.StateFile == "" {
		return d, nil
	}
	raw, err := os.ReadFile(opts.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var saved []savedInstance
	if err := json.Unmarshal(raw, &saved); err != nil {
		return nil, fmt.Errorf("parse state %s: %w", opts.StateFile, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range saved {
		info, auth := s.InstanceInfo, s.RequiredAuth
		if err := auth.Validate(); err != nil {
			// An instance saved by a daemon from before credentials (or with a damaged
			// record) has none to require. It comes back refusing every request with 407
			// rather than open: an open proxy is what no provider ever runs, and the
			// worker's probes see the 407 and replace it with one that has credentials.
			d.log.Warn("instance has no valid credentials; it refuses every request until replaced", "instance", info.Name, "reason", err.Error())
			auth = nil
		}
		info.Auth = auth != nil
		inst := &instance{info: info, auth: auth, proxy: d.newProxy(auth)}
		inst.proxy.SetFault(info.Fault)
		d.instances[info.Name] = inst
		if info.State != local.StateStopped {
			// Come back on the same port, so addresses recorded elsewhere stay true.
			if err := d.listen(inst, info.Port); err != nil {
				d.log.Warn("instance could not listen on its old port; marked stopped", "instance", info.Name, "port", info.Port, "error", err)
				inst.info.State = local.StateStopped
			}
		}
	}
	return d, d.saveLocked()
}

func (d *Daemon) newProxy(auth *local.Auth) *ForwardProxy {
	return &ForwardProxy{AllowRemote: d.opts.AllowRemote, Auth: auth}
}

// listen starts the instance's proxy on 127.0.0.1:port (0 picks a free port).
func (d *Daemon) listen(inst *instance, port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return err
	}
	inst.listener = ln
	inst.server = &http.Server{Handler: inst.proxy, ReadHeaderTimeout: 30 * time.Second}
	inst.info.IP = "127.0.0.1"
	inst.info.Port = ln.Addr().(*net.TCPAddr).Port
	if d.opts.DistinctEgress {
		inst.proxy.SourceIP = EgressIP(inst.info.Port)
	}
	inst.info.State = local.StateRunning
	srv := inst.server
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// EgressIP is the loopback address an instance listening on port connects to targets
// from when DistinctEgress is on: 127.88.<port/256>.<port%256>, one per port, the same
// after a restart.
func EgressIP(port int) net.IP {
	return net.IPv4(127, 88, byte(port>>8), byte(port))
}

func (d *Daemon) changed(op, name string) {
	if d.opts.OnChange != nil {
		d.opts.OnChange(op, name, len(d.instances))
	}
}

func (d *Daemon) stopLocked(inst *instance) {
	if inst.ready != nil {
		inst.ready.Stop()
		inst.ready = nil
	}
	if inst.server != nil {
		// Close, not Shutdown: a killed proxy drops its connections, tunnels included.
		_ = inst.server.Close()
		inst.server, inst.listener = nil, nil
	}
	inst.proxy.SetFault(local.FaultNone) // releases hung requests
}

// Create starts an instance, or returns the existing one: creating is idempotent. An
// existing instance is returned as it is and keeps the credentials it was created with,
// whatever req.Auth says: a proxy's credentials do not change under its clients, and the
// worker replaces (under a new name) an instance whose credentials are not the ones it
// expects.
func (d *Daemon) Create(name string, req local.CreateRequest) (local.InstanceInfo, bool, error) {
	if !nameRE.MatchString(name) {
		return local.InstanceInfo{}, false, fmt.Errorf("%w: instance name %q", errInvalid, name)
	}
	if err := req.Auth.Validate(); err != nil {
		return local.InstanceInfo{}, false, fmt.Errorf("%w: %w", errInvalid, err)
	}
	// A copy, so the caller's struct cannot change what the instance requires.
	auth := *req.Auth
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return local.InstanceInfo{}, false, errors.New("daemon is shutting down")
	}
	if inst, ok := d.instances[name]; ok {
		return inst.info, false, nil
	}
	created := time.Now().UTC()
	if req.CreatedAt != nil {
		created = req.CreatedAt.UTC()
	}
	inst := &instance{
		info:  local.InstanceInfo{Name: name, Labels: req.Labels, CreatedAt: created, State: local.StateProvisioning, Auth: true},
		auth:  &auth,
		proxy: d.newProxy(&auth),
	}
	if d.opts.ProvisionDelay > 0 {
		inst.ready = time.AfterFunc(d.opts.ProvisionDelay, func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			if cur, ok := d.instances[name]; !ok || cur != inst || inst.info.State != local.StateProvisioning {
				return
			}
			if err := d.listen(inst, 0); err != nil {
				d.log.Error("instance failed to listen", "instance", name, "error", err)
				inst.info.State = local.StateStopped
			}
			_ = d.saveLocked()
		})
	} else if err := d.listen(inst, 0); err != nil {
		return local.InstanceInfo{}, false, err
	}
	d.instances[name] = inst
	d.changed("create", name)
	d.log.Info("instance created", "instance", name, "port", inst.info.Port)
	return inst.info, true, d.saveLocked()
}

// Get returns an instance.
func (d *Daemon) Get(name string) (local.InstanceInfo, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	inst, ok := d.instances[name]
	if !ok {
		return local.InstanceInfo{}, false
	}
	return inst.info, true
}

// Delete stops and forgets an instance; it reports whether one existed.
func (d *Daemon) Delete(name string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	inst, ok := d.instances[name]
	if !ok {
		return false, nil
	}
	d.stopLocked(inst)
	delete(d.instances, name)
	d.changed("delete", name)
	d.log.Info("instance deleted", "instance", name)
	return true, d.saveLocked()
}

// Kill stops an instance's listener but keeps its record, as a crashed VM would be: the
// provider then reports it Stopped.
func (d *Daemon) Kill(name string) (local.InstanceInfo, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	inst, ok := d.instances[name]
	if !ok {
		return local.InstanceInfo{}, false, nil
	}
	d.stopLocked(inst)
	inst.info.State = local.StateStopped
	return inst.info, true, d.saveLocked()
}

// SetFault makes an instance misbehave (or behave again with local.FaultNone).
func (d *Daemon) SetFault(name string, f local.Fault) (local.InstanceInfo, bool, error) {
	switch f {
	case local.FaultNone, local.FaultAuth, local.FaultBadGateway, local.FaultHang:
	default:
		return local.InstanceInfo{}, false, fmt.Errorf("unknown fault %q (want auth, badgateway, hang or none)", f)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	inst, ok := d.instances[name]
	if !ok {
		return local.InstanceInfo{}, false, nil
	}
	inst.proxy.SetFault(f)
	inst.info.Fault = f
	return inst.info, true, d.saveLocked()
}

// List returns the instances whose labels include every pair in match, by name.
func (d *Daemon) List(match map[string]string) []local.InstanceInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := []local.InstanceInfo{}
	for _, inst := range d.instances {
		ok := true
		for k, v := range match {
			if inst.info.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, inst.info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Close stops every listener. The state file keeps the instances for the next start.
func (d *Daemon) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for _, inst := range d.instances {
		if inst.server != nil {
			_ = inst.server.Close()
		}
		if inst.ready != nil {
			inst.ready.Stop()
		}
	}
	return nil
}

func (d *Daemon) saveLocked() error {
	if d.opts.StateFile == "" {
		return nil
	}
	infos := make([]savedInstance, 0, len(d.instances))
	for _, inst := range d.instances {
		infos = append(infos, savedInstance{InstanceInfo: inst.info, RequiredAuth: inst.auth})
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	raw, err := json.MarshalIndent(infos, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.opts.StateFile + ".tmp"
	if err := os.MkdirAll(filepath.Dir(d.opts.StateFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, d.opts.StateFile)
}

// Handler is the control API:
//
//	PUT    /v1/instances/{name}        create (idempotent): 201 new, 200 existing;
//	                                   {"labels":{…},"auth":{"username":…,"passwordSHA256":…}},
//	                                   auth required (400 without)
//	GET    /v1/instances/{name}        200 or 404
//	DELETE /v1/instances/{name}        204 (also when missing)
//	GET    /v1/instances?label.k=v     list by labels
//	POST   /v1/instances/{name}/kill   stop the listener, keep the record (a crash)
//	POST   /v1/instances/{name}/fault  {"fault":"auth|badgateway|hang|"} misbehave on purpose
//	GET    /healthz                    200, also a handy local probe target
//	GET    /slow?seconds=N             200 after N seconds (at most 30): a slow local site,
//	                                   whose requests hold their proxies long enough to be demand
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		secs, err := strconv.ParseFloat(cmp.Or(r.URL.Query().Get("seconds"), "1"), 64)
		if err != nil || secs < 0 || secs > 30 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "seconds must be a number from 0 to 30"})
			return
		}
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		select {
		case <-t.C:
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("PUT /v1/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		var req local.CreateRequest
		if r.ContentLength != 0 {
			if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil {
				writeError(w, http.StatusBadRequest, "invalid body: "+err.Error())
				return
			}
		}
		info, created, err := d.Create(r.PathValue("name"), req)
		switch {
		case errors.Is(err, errInvalid):
			writeError(w, http.StatusBadRequest, err.Error())
		case err != nil:
			writeError(w, http.StatusServiceUnavailable, err.Error())
		case created:
			writeJSON(w, http.StatusCreated, info)
		default:
			writeJSON(w, http.StatusOK, info)
		}
	})
	mux.HandleFunc("GET /v1/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		info, ok := d.Get(r.PathValue("name"))
		if !ok {
			writeError(w, http.StatusNotFound, "no instance "+r.PathValue("name"))
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("DELETE /v1/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		if _, err := d.Delete(r.PathValue("name")); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/instances", func(w http.ResponseWriter, r *http.Request) {
		match := map[string]string{}
		for k, vs := range r.URL.Query() {
			if key, ok := strings.CutPrefix(k, "label."); ok && len(vs) > 0 {
				match[key] = vs[0]
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"instances": d.List(match)})
	})
	mux.HandleFunc("POST /v1/instances/{name}/kill", func(w http.ResponseWriter, r *http.Request) {
		info, ok, err := d.Kill(r.PathValue("name"))
		respondChange(w, r, info, ok, err)
	})
	mux.HandleFunc("POST /v1/instances/{name}/fault", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Fault local.Fault `json:"fault"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<12)).Decode(&body); err != nil {
			writeError(w, http.StatusBadRequest, "invalid body: "+err.Error())
			return
		}
		info, ok, err := d.SetFault(r.PathValue("name"), body.Fault)
		if err != nil && !ok {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		respondChange(w, r, info, ok, err)
	})
	return mux
}

func respondChange(w http.ResponseWriter, r *http.Request, info local.InstanceInfo, ok bool, err error) {
	switch {
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	case !ok:
		writeError(w, http.StatusNotFound, "no instance "+r.PathValue("name"))
	default:
		writeJSON(w, http.StatusOK, info)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// Serve runs the control API on ln until ctx ends; the instances keep running until Close.
// Callers listen on loopback: the API has no authentication (cmd/localproxyd refuses
// anything else).
func (d *Daemon) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
