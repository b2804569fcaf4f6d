package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"qrtd.io/tools/clients/go/qrtd"
)

// RunConfig: the driver plus where the kubelet finds it.
type RunConfig struct {
	Config
	KubeClient kubernetes.Interface
	// The plugin's own directory (its DRA socket; kubelet
	// /var/lib/kubelet/plugins/qpu.qrtd.io) and the kubelet's registry
	// (/var/lib/kubelet/plugins_registry).
	PluginDir   string
	RegistryDir string
	// How often the registration socket is checked for (a kubelet that
	// restarts with a clean registry deletes it; the driver then serves a
	// new one and the kubelet dials it).
	Watchdog time.Duration
}

// RegistrationSocket is where the kubelet dials the driver.
func (rc RunConfig) RegistrationSocket() string {
	return filepath.Join(rc.RegistryDir, DriverName+"-reg.sock")
}

// DRASocket is the DRA gRPC service's socket.
func (rc RunConfig) DRASocket() string { return filepath.Join(rc.PluginDir, "dra.sock") }

type helperPublisher struct {
	mu sync.Mutex
	h  *kubeletplugin.Helper
}

func (p *helperPublisher) set(h *kubeletplugin.Helper) {
	p.mu.Lock()
	p.h = h
	p.mu.Unlock()
}

func (p *helperPublisher) PublishResources(ctx context.Context, r resourceslice.DriverResources) error {
	p.mu.Lock()
	h := p.h
	p.mu.Unlock()
	if h == nil {
		return errors.New("plugin helper not running")
	}
	return h.PublishResources(ctx, r)
}

// Run serves the kubelet until ctx ends: registration and DRA gRPC
// services (kubeletplugin), the ResourceSlice, heartbeats.
func Run(ctx context.Context, rc RunConfig, client *qrtd.Client) error {
	logger := klog.FromContext(ctx)
	if rc.NodeName == "" {
		return errors.New("the node name is required (--node-name or NODE_NAME)")
	}
	if rc.Watchdog <= 0 {
		rc.Watchdog = time.Second
	}
	d, err := New(rc.Config, client)
	if err != nil {
		return err
	}
	d.kube, d.bg = rc.KubeClient, ctx
	kick := make(chan struct{}, 1)
	// After every successful registration the kubelet has (re)started and
	// deleted this node's ResourceSlices: publish again.
	registered := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if st, ok := req.(*registerapi.RegistrationStatus); ok && strings.HasSuffix(info.FullMethod, "/NotifyRegistrationStatus") {
			if st.PluginRegistered {
				logger.Info("Registered with the kubelet")
				select {
				case kick <- struct{}{}:
				default:
				}
			} else {
				logger.Info("The kubelet refused the registration", "error", st.Error)
			}
		}
		return resp, err
	}
	start := func() (*kubeletplugin.Helper, error) {
		return kubeletplugin.Start(ctx, d,
			kubeletplugin.DriverName(DriverName),
			kubeletplugin.NodeName(rc.NodeName),
			kubeletplugin.KubeClient(rc.KubeClient),
			kubeletplugin.PluginDataDirectoryPath(rc.PluginDir),
			kubeletplugin.RegistrarDirectoryPath(rc.RegistryDir),
			kubeletplugin.GRPCInterceptor(registered),
			// Claims are locked one by one (Driver.lockClaim): 32 pods'
			// prepares run at once.
			kubeletplugin.Serialize(false),
		)
	}
	if err := os.MkdirAll(rc.PluginDir, 0o750); err != nil {
		return err
	}
	if err := os.MkdirAll(rc.RegistryDir, 0o750); err != nil {
		return err
	}
	helper, err := start()
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	// Claims prepared before a restart: their pods' sockets again.
	d.ServeClaims(ctx)
	defer d.stopAllClaims()
	pub := &helperPublisher{h: helper}
	var wg sync.WaitGroup
	if rc.BindingConditions && rc.KubeClient != nil {
		wg.Add(1)
		go func() { defer wg.Done(); d.BindingController(ctx) }()
	}
	calibration := make(chan struct{}, 1)
	wg.Add(3)
	go func() { defer wg.Done(); d.HeartbeatLoop(ctx) }()
	go func() { defer wg.Done(); d.EventLoop(ctx, calibration) }()
	go func() { defer wg.Done(); d.PublishLoop(ctx, pub, kick, calibration) }()
	logger.Info("Serving", "registration", rc.RegistrationSocket(), "dra", rc.DRASocket(), "qrtd", client.Path())
	t := time.NewTicker(rc.Watchdog)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			helper.Stop()
			wg.Wait()
			return nil
		case <-t.C:
			if _, err := os.Stat(rc.RegistrationSocket()); err == nil || !errors.Is(err, os.ErrNotExist) {
				continue
			}
			logger.Info("Registration socket gone (kubelet restart?): serving a new one")
			helper.Stop()
			if helper, err = start(); err != nil {
				pub.set(nil)
				return fmt.Errorf("restart the kubelet plugin: %w", err)
			}
			pub.set(helper)
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}
}
