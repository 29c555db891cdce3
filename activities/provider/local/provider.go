package local

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// Provider drives a local daemon. Instance IDs are instance names: there is one host.
type Provider struct {
	// BaseURL is the daemon's control API, e.g. http://127.0.0.1:8089.
	BaseURL string
	HTTP    *http.Client
}

var _ provider.Provider = (*Provider)(nil)

// NewProvider returns a Provider for the daemon at baseURL.
func NewProvider(baseURL string) *Provider {
	return &Provider{BaseURL: baseURL, HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// ProviderID implements provider.Provider.
func (p *Provider) ProviderID(req provider.CreateRequest) string { return req.Name }

// Create implements provider.Provider. The instance requires req.Credentials; the daemon
// is sent only a hash of the password.
//
// Creating a name that exists returns that instance as it is, with the credentials it was
// created with, whatever this request carries: the daemon never changes an instance's
// credentials. A retried Create sends the same ones anyway (they are derived from KeyID and
// the name), and an instance that requires others (an older key's, or none at all, restored
// from an older daemon's state) answers the worker's probes with 407 and is replaced under a
// new name, as a real proxy with the wrong configuration would be.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if req.Credentials.Username == "" || req.Credentials.Password == "" {
		// Retrying cannot supply them: the worker that built req has no fleet key set up.
		return provider.Instance{}, provider.Permanent(fmt.Errorf("create %s: the worker gave no credentials; a Managed proxy always requires a user name and password", req.Name))
	}
	body, _ := json.Marshal(CreateRequest{Labels: req.Labels(), Auth: NewAuth(req.Credentials)})
	var info InstanceInfo
	if err := p.do(ctx, http.MethodPut, "/v1/instances/"+url.PathEscape(req.Name), body, &info); err != nil {
		return provider.Instance{}, err
	}
	return toInstance(info), nil
}

// Get implements provider.Provider.
func (p *Provider) Get(ctx context.Context, id string) (provider.Instance, error) {
	var info InstanceInfo
	if err := p.do(ctx, http.MethodGet, "/v1/instances/"+url.PathEscape(id), nil, &info); err != nil {
		return provider.Instance{}, err
	}
	return toInstance(info), nil
}

// Delete implements provider.Provider.
func (p *Provider) Delete(ctx context.Context, id string) error {
	return p.do(ctx, http.MethodDelete, "/v1/instances/"+url.PathEscape(id), nil, nil)
}

// ListOwned implements provider.Provider. The daemon ANDs every label.k=v it is given.
func (p *Provider) ListOwned(ctx context.Context, owner provider.Owner) ([]provider.Instance, error) {
	if err := owner.Check(); err != nil {
		return nil, err
	}
	q := url.Values{}
	for k, v := range owner.Selector() {
		q.Set("label."+k, v)
	}
	var out struct {
		Instances []InstanceInfo `json:"instances"`
	}
	if err := p.do(ctx, http.MethodGet, "/v1/instances?"+q.Encode(), nil, &out); err != nil {
		return nil, err
	}
	list := make([]provider.Instance, 0, len(out.Instances))
	for _, info := range out.Instances {
		// An older daemon, or one that ignores a parameter, would answer too broadly; the
		// sweeper deletes what this returns, so the labels are checked here as well.
		if owner.Owns(info.Labels) {
			list = append(list, toInstance(info))
		}
	}
	return list, nil
}

// Kill simulates a crashed instance (tests and demos).
func (p *Provider) Kill(ctx context.Context, name string) error {
	return p.do(ctx, http.MethodPost, "/v1/instances/"+url.PathEscape(name)+"/kill", nil, nil)
}

// SetFault makes an instance misbehave (tests and demos).
func (p *Provider) SetFault(ctx context.Context, name string, f Fault) error {
	body, _ := json.Marshal(map[string]Fault{"fault": f})
	return p.do(ctx, http.MethodPost, "/v1/instances/"+url.PathEscape(name)+"/fault", body, nil)
}

// CreateRaw creates an instance with arbitrary labels and creation time, outside any Proxy
// (tests of the orphan sweeper). req.Auth is required, as for every instance.
func (p *Provider) CreateRaw(ctx context.Context, name string, req CreateRequest) (InstanceInfo, error) {
	body, _ := json.Marshal(req)
	var info InstanceInfo
	err := p.do(ctx, http.MethodPut, "/v1/instances/"+url.PathEscape(name), body, &info)
	return info, err
}

func toInstance(info InstanceInfo) provider.Instance {
	state := provider.StateProvisioning
	switch info.State {
	case StateRunning:
		state = provider.StateRunning
	case StateStopped:
		state = provider.StateStopped
	}
	inst := provider.Instance{
		Name: info.Name, ProviderID: info.Name, State: state,
		CreatedAt: info.CreatedAt, Labels: info.Labels,
	}
	if state == provider.StateRunning {
		inst.IP, inst.Port = info.IP, int32(info.Port)
	}
	return inst
}

func (p *Provider) do(ctx context.Context, method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.BaseURL+path, rd)
	if err != nil {
		return provider.Permanent(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	client := p.HTTP
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		// The daemon being down is a wait, not a failure of the Proxy.
		return fmt.Errorf("local daemon %s: %w", p.BaseURL, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s %s: %w", method, path, provider.ErrNotFound)
	case resp.StatusCode == http.StatusBadRequest:
		return provider.Permanent(fmt.Errorf("%s %s: %s", method, path, bytes.TrimSpace(raw)))
	case resp.StatusCode >= 300:
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return nil
}
