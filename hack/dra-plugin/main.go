// The testbed's DRA kubelet plugin: one process per real node of the local cluster
// (hack/localkube/realnode.py starts it beside the node's kubelet), registered with that kubelet
// for every driver whose ResourceSlices name the node, through the kubelet-plugin helper of
// k8s.io/dynamic-resource-allocation.
//
//   - Drivers in --devices (a JSON file {driver: [device, ...]}, written from the topology) are
//     published by this process: one pool, named for the node, of those devices.
//   - Any other driver whose slices name the node (a test brings its own) is registered as soon
//     as its first slice appears; its slices stay whoever's published them.
//
// Preparing a claim writes one CDI spec per claim and driver into --cdi-dir (the directory the
// node's containerd reads CDI specs from): a CDI device per allocated device, whose only edit is an
// environment variable naming the device, its pool, request and PCIe root, so the pod shows what
// it got. Nothing on the host is touched: the devices are the topology's, not the machine's.
// Unpreparing removes the spec.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const (
	cdiVendor  = "holmes.dev"
	cdiVersion = "0.6.0"
	pcieRoot   = "resource.kubernetes.io/pcieRoot"
	envPrefix  = "DRA_"
)

type config struct {
	node, kubeletDir, pluginDir, cdiDir string
}

// driver is one registered DRA driver: the helper and what the node's slices say of its devices.
type driver struct {
	name   string
	cfg    config
	slices cache.Indexer // every ResourceSlice naming the node (all drivers)
	helper *kubeletplugin.Helper
	stop   context.CancelCauseFunc
}

func main() {
	var cfg config
	var kubeconfig, devicesFile string
	flag.StringVar(&cfg.node, "node-name", "", "the node this plugin serves (required)")
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (required)")
	flag.StringVar(&cfg.kubeletDir, "kubelet-dir", "", "the kubelet's --root-dir (required): its plugins_registry and plugins/")
	flag.StringVar(&cfg.pluginDir, "plugin-dir", "", "a directory of this plugin's own: a socket per driver the kubelet calls (required)")
	flag.StringVar(&cfg.cdiDir, "cdi-dir", "", "where the node's containerd reads CDI specs (required)")
	flag.StringVar(&devicesFile, "devices", "", "JSON {driver: [resource.k8s.io/v1 Device, ...]} to publish for the node")
	klog.InitFlags(nil)
	flag.Parse()
	for name, v := range map[string]string{"node-name": cfg.node, "kubeconfig": kubeconfig, "kubelet-dir": cfg.kubeletDir, "plugin-dir": cfg.pluginDir, "cdi-dir": cfg.cdiDir} {
		if v == "" {
			fail(fmt.Errorf("--%s is required", name))
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	if err := run(ctx, cfg, kubeconfig, devicesFile); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "dra-plugin: %v\n", err)
	os.Exit(1)
}

func run(ctx context.Context, cfg config, kubeconfig, devicesFile string) error {
	publish := map[string][]resourceapi.Device{}
	if devicesFile != "" {
		data, err := os.ReadFile(devicesFile)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, &publish); err != nil {
			return fmt.Errorf("--devices %s: not {driver: [device, ...]}: %w", devicesFile, err)
		}
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.cdiDir, 0o755); err != nil {
		return err
	}
	registry := filepath.Join(cfg.kubeletDir, "plugins_registry")
	for { // the kubelet makes it at start
		if _, err := os.Stat(registry); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}

	// The node's slices, every driver's: which drivers to register, and the attributes of the
	// devices a claim was allocated.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, cfg.node).String()
	}))
	informer := factory.Resource().V1().ResourceSlices().Informer()

	var mu sync.Mutex
	drivers := map[string]*driver{}
	register := func(name string, devices []resourceapi.Device) {
		mu.Lock()
		defer mu.Unlock()
		if drivers[name] != nil || ctx.Err() != nil {
			return
		}
		d, err := startDriver(ctx, cfg, client, informer.GetIndexer(), name)
		if err != nil {
			klog.ErrorS(err, "registering driver", "driver", name)
			return
		}
		drivers[name] = d
		if devices != nil {
			pools := map[string]resourceslice.Pool{cfg.node: {Slices: []resourceslice.Slice{{Devices: devices}}}}
			if err := d.helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools}); err != nil {
				klog.ErrorS(err, "publishing devices", "driver", name)
			}
		}
		klog.InfoS("serving", "driver", name, "node", cfg.node, "published", len(devices))
		go d.awaitRegistration(ctx)
	}
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*resourceapi.ResourceSlice); ok {
				register(s.Spec.Driver, nil)
			}
		},
	})
	if err != nil {
		return err
	}
	names := make([]string, 0, len(publish))
	for name := range publish {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		register(name, publish[name])
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	mu.Lock()
	defer mu.Unlock()
	for _, d := range drivers {
		d.helper.Stop()
		d.stop(errors.New("plugin stopped"))
	}
	return nil
}

func startDriver(ctx context.Context, cfg config, client kubernetes.Interface, slices cache.Indexer, name string) (*driver, error) {
	data := filepath.Join(cfg.pluginDir, name)
	if err := os.MkdirAll(data, 0o750); err != nil {
		return nil, err
	}
	registry := filepath.Join(cfg.kubeletDir, "plugins_registry")
	dctx, stop := context.WithCancelCause(ctx)
	d := &driver{name: name, cfg: cfg, slices: slices, stop: stop}
	helper, err := kubeletplugin.Start(dctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(cfg.node),
		kubeletplugin.DriverName(name),
		kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.RegistrarSocketFilename(registrarSocket(registry, name)),
		kubeletplugin.PluginDataDirectoryPath(data),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		stop(err)
		return nil, err
	}
	d.helper = helper
	return d, nil
}

// awaitRegistration says when the kubelet has registered the driver (it calls the driver only
// from then on: a pod it starts before fails to prepare until its next sync).
func (d *driver) awaitRegistration(ctx context.Context) {
	for ctx.Err() == nil {
		if st := d.helper.RegistrationStatus(); st != nil && st.PluginRegistered {
			klog.InfoS("registered with the kubelet", "driver", d.name, "node", d.cfg.node)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// registrarSocket is the registration socket's name in the kubelet's registry: the helper's
// <driver>-reg.sock, or a short name where that path would pass a unix socket's 108 bytes (a
// node's kubelet dir lies deep in a checkout's state dir).
func registrarSocket(registry, driver string) string {
	name := driver + "-reg.sock"
	if len(filepath.Join(registry, name)) < 100 {
		return name
	}
	sum := sha256.Sum256([]byte(driver))
	return fmt.Sprintf("%x-reg.sock", sum[:6])
}

// cdiClass is the CDI class of a driver's devices: its name with dots as dashes (gpu-nvidia-com).
func (d *driver) cdiClass() string { return strings.ReplaceAll(d.name, ".", "-") }

func (d *driver) specPath(claim types.UID) string {
	return filepath.Join(d.cfg.cdiDir, fmt.Sprintf("%s-%s_%s.json", cdiVendor, d.cdiClass(), claim))
}

// envName is the variable a device shows itself by: DRA_<DRIVER>_<DEVICE>, upper case, every
// other character an underscore (DRA_GPU_NVIDIA_COM_GPU_0).
func envName(driver, device string) string {
	up := strings.ToUpper(driver + "_" + device)
	return envPrefix + strings.Map(func(r rune) rune {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, up)
}

// attribute finds a device's attribute in the node's slices of this driver ("" when none).
func (d *driver) attribute(pool, device, name string) string {
	for _, obj := range d.slices.List() {
		s, ok := obj.(*resourceapi.ResourceSlice)
		if !ok || s.Spec.Driver != d.name || s.Spec.Pool.Name != pool {
			continue
		}
		for _, dev := range s.Spec.Devices {
			if dev.Name != device {
				continue
			}
			short := strings.TrimPrefix(name, d.name+"/")
			for _, key := range []resourceapi.QualifiedName{resourceapi.QualifiedName(name), resourceapi.QualifiedName(short)} {
				if a, ok := dev.Attributes[key]; ok && a.StringValue != nil {
					return *a.StringValue
				}
			}
		}
	}
	return ""
}

type cdiDevice struct {
	Name           string         `json:"name"`
	ContainerEdits map[string]any `json:"containerEdits"`
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		out[claim.UID] = d.prepare(claim)
	}
	return out, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	var devices []kubeletplugin.Device
	var specDevices []cdiDevice
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		value := fmt.Sprintf("device=%s pool=%s request=%s", r.Device, r.Pool, r.Request)
		if root := d.attribute(r.Pool, r.Device, pcieRoot); root != "" {
			value += " pcieRoot=" + root
		}
		if hca := d.attribute(r.Pool, r.Device, d.name+"/rdmaDevice"); hca != "" {
			value += " rdmaDevice=" + hca
		}
		// unique per claim: a runtime may cache specs, and a claim UID is never reused
		name := fmt.Sprintf("%s-%s", claim.UID, r.Device)
		specDevices = append(specDevices, cdiDevice{
			Name:           name,
			ContainerEdits: map[string]any{"env": []string{envName(d.name, r.Device) + "=" + value}},
		})
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{fmt.Sprintf("%s/%s=%s", cdiVendor, d.cdiClass(), name)},
		})
	}
	spec := map[string]any{"cdiVersion": cdiVersion, "kind": cdiVendor + "/" + d.cdiClass(), "devices": specDevices}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err == nil {
		err = writeAtomically(d.specPath(claim.UID), data)
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("writing the CDI spec of claim %s/%s: %w", claim.Namespace, claim.Name, err)}
	}
	klog.InfoS("prepared", "driver", d.name, "claim", klog.KObj(claim), "devices", len(devices))
	return kubeletplugin.PrepareResult{Devices: devices}
}

func writeAtomically(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // idempotent: the kubelet may ask again
		}
		out[c.UID] = err
		klog.InfoS("unprepared", "driver", d.name, "claim", c.String())
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.ErrorS(err, msg, "driver", d.name)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.stop(err)
	}
}

func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
