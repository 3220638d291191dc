package check

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/testenv"
)

const chartDir = "../helm/outbox-cdc"

// release is a rendered release: every object, decoded strictly into its
// type.
type release struct {
	name           string
	deployment     *appsv1.Deployment
	configMap      *corev1.ConfigMap
	service        *corev1.Service
	serviceAccount *corev1.ServiceAccount
	pdb            *policyv1.PodDisruptionBudget
	netpol         *networkingv1.NetworkPolicy
	serviceMonitor *monitoringv1.ServiceMonitor
	rule           *monitoringv1.PrometheusRule
	objects        []metav1.Object
	kinds          []string
}

// required are the values a release must set.
func required() map[string]any {
	return map[string]any{
		"postgres": map[string]any{"url": "postgres://cdc@orders-db:5432/app?sslmode=verify-full&sslrootcert=/etc/cdc/tls/postgres-ca.crt"},
		"kafka":    map[string]any{"brokers": []any{"kafka-0.kafka:9092", "kafka-1.kafka:9092"}},
	}
}

// render renders the chart as helm install name would with vals over the
// chart's defaults, or returns Helm's error.
func render(t *testing.T, name string, vals map[string]any) (*release, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: name, Namespace: "data", IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	r := &release{name: name}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if !strings.HasSuffix(n, ".yaml") {
			continue // NOTES.txt, the helpers
		}
		for _, doc := range strings.Split(files[n], "\n---") {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v\n%s", n, err, doc)
			}
			var obj any
			switch tm.Kind {
			case "Deployment":
				r.deployment = &appsv1.Deployment{}
				obj = r.deployment
			case "ConfigMap":
				r.configMap = &corev1.ConfigMap{}
				obj = r.configMap
			case "Service":
				r.service = &corev1.Service{}
				obj = r.service
			case "ServiceAccount":
				r.serviceAccount = &corev1.ServiceAccount{}
				obj = r.serviceAccount
			case "PodDisruptionBudget":
				r.pdb = &policyv1.PodDisruptionBudget{}
				obj = r.pdb
			case "NetworkPolicy":
				r.netpol = &networkingv1.NetworkPolicy{}
				obj = r.netpol
			case "ServiceMonitor":
				r.serviceMonitor = &monitoringv1.ServiceMonitor{}
				obj = r.serviceMonitor
			case "PrometheusRule":
				r.rule = &monitoringv1.PrometheusRule{}
				obj = r.rule
			default:
				t.Fatalf("%s renders a %s, which this test does not know", n, tm.Kind)
			}
			// Strict: a misspelt or misplaced field fails, as
			// kubectl apply --validate=strict would.
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s: a %s that does not decode strictly: %v\n%s", n, tm.Kind, err, doc)
			}
			r.objects = append(r.objects, obj.(metav1.Object))
			r.kinds = append(r.kinds, tm.Kind)
		}
	}
	return r, nil
}

func mustRender(t *testing.T, name string, vals map[string]any) *release {
	t.Helper()
	r, err := render(t, name, vals)
	if err != nil {
		t.Fatalf("helm template %s: %v", name, err)
	}
	return r
}

// merge sets over's keys into base, recursively.
func merge(base, over map[string]any) map[string]any {
	for k, v := range over {
		if m, ok := v.(map[string]any); ok {
			if b, ok := base[k].(map[string]any); ok {
				base[k] = merge(b, m)
				continue
			}
		}
		base[k] = v
	}
	return base
}

// connectorConfig loads the rendered cdc.yaml with the connector's own
// loader and validation, as the pod's cdc run will.
func connectorConfig(t *testing.T, r *release) (config.Config, config.Log) {
	t.Helper()
	if r.configMap == nil {
		t.Fatal("no ConfigMap")
	}
	path := filepath.Join(t.TempDir(), "cdc.yaml")
	if err := os.WriteFile(path, []byte(r.configMap.Data["cdc.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	// The files the *_file keys and the URL name are mounted in the pod;
	// here they are stand-ins: a key for a secret, a certificate or key of
	// a throwaway CA for a TLS file.
	body := r.configMap.Data["cdc.yaml"]
	certs := testenv.NewCerts(t)
	for _, f := range regexp.MustCompile(`/etc/cdc/(secrets|tls)/[a-z.-]+`).FindAllString(body, -1) {
		var stand string
		switch {
		case strings.HasSuffix(f, "-ca.crt"):
			stand = certs.CAFile
		case strings.HasSuffix(f, ".crt"):
			stand = certs.ClientCert
		case strings.HasSuffix(f, ".key"):
			stand = certs.ClientKey
		default:
			stand = filepath.Join(t.TempDir(), filepath.Base(f))
			os.WriteFile(stand, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
		}
		body = strings.ReplaceAll(body, f, stand)
	}
	os.WriteFile(path, []byte(body), 0o600)
	cfg, lc, err := config.Load(path, config.Map())
	if err != nil {
		t.Fatalf("the rendered cdc.yaml does not load: %v\n%s", err, r.configMap.Data["cdc.yaml"])
	}
	// As cdc run and cdc check --offline take it: validated, and the
	// routing built.
	p, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatalf("the rendered cdc.yaml does not validate: %v\n%s", err, r.configMap.Data["cdc.yaml"])
	}
	return p.Config(), lc
}

// TestChartDefaults renders the chart with its default values and the two
// a release must set, and checks what a platform team relies on.
func TestChartDefaults(t *testing.T) {
	r := mustRender(t, "orders-cdc", required())
	for _, kind := range []string{"ConfigMap", "Deployment", "Service", "ServiceAccount", "PodDisruptionBudget"} {
		if !slices.Contains(r.kinds, kind) {
			t.Errorf("no %s in %v", kind, r.kinds)
		}
	}
	if r.serviceMonitor != nil || r.rule != nil {
		t.Error("a ServiceMonitor or PrometheusRule by default; they need the prometheus-operator's CRDs")
	}
	d := r.deployment
	spec := d.Spec.Template.Spec
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2: active and standby", *d.Spec.Replicas)
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge.IntValue() != 1 {
		t.Errorf("rolling update %+v; want a surge of 1 and none unavailable", ru)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image != "ghcr.io/outboxcdc/cdc:v0.1.0" || strings.Join(c.Args, " ") != "run --config /etc/cdc/config/cdc.yaml" {
		t.Errorf("image %s, args %v", c.Image, c.Args)
	}

	// Probes: /healthz for both, never /readyz, which a standby fails by
	// design.
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "http-metrics" {
			t.Errorf("%s probe %+v; want GET /healthz on http-metrics", name, p)
		}
	}
	if c.StartupProbe != nil {
		t.Error("a startup probe: /healthz answers from the start")
	}

	// The config: the connector's loader takes it, named after the release.
	cfg, lc := connectorConfig(t, r)
	if cfg.Name != "orders-cdc" || lc.HTTP.Listen != "0.0.0.0:9187" || cfg.Postgres.Slot != "orders_cdc" || len(cfg.Tables) != 1 {
		t.Errorf("config name %q, listen %q, slot %q, %d tables", cfg.Name, lc.HTTP.Listen, cfg.Postgres.Slot, len(cfg.Tables))
	}
	if got := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second; got <= cfg.ShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds %s is not longer than shutdown_timeout %s", got, cfg.ShutdownTimeout)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m, ok := mounts["/etc/cdc/config"]; !ok || !m.ReadOnly {
		t.Errorf("the config is not mounted read-only at /etc/cdc/config: %+v", c.VolumeMounts)
	}
	if _, ok := mounts["/etc/cdc/secrets"]; ok {
		t.Error("a secrets volume with no Secret set")
	}
	if cm := volume(t, spec, mounts["/etc/cdc/config"].Name).ConfigMap; cm == nil || cm.Name != r.configMap.Name {
		t.Errorf("the config volume is not the release's ConfigMap")
	}

	// Security: not root, read-only root, no privilege, no capability, no
	// API token.
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v", psc)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context %+v", sc)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || spec.ServiceAccountName != r.serviceAccount.Name {
		t.Error("the pod mounts a service account token, or not the release's account")
	}

	// Resources from docs/benchmarks.md: the memory limit covers
	// max_in_flight_bytes and the 40 MiB the connector adds to it.
	limit := c.Resources.Limits[corev1.ResourceMemory]
	if need := resource.NewQuantity(cfg.MaxInFlightBytes+40<<20, resource.BinarySI); limit.Cmp(*need) < 0 {
		t.Errorf("memory limit %s is under max_in_flight_bytes + 40 MiB (%s)", limit.String(), need.String())
	}
	if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Error("a CPU limit: throttling shows as latency")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("no requests")
	}

	// The PDB and the Service select exactly these pods.
	labels := d.Spec.Template.Labels
	if r.pdb.Spec.MaxUnavailable.IntValue() != 1 || !selects(r.pdb.Spec.Selector.MatchLabels, labels) {
		t.Errorf("PDB %+v", r.pdb.Spec)
	}
	if !selects(r.service.Spec.Selector, labels) || len(r.service.Spec.Ports) != 1 || r.service.Spec.Ports[0].Port != 9187 {
		t.Errorf("service %+v", r.service.Spec)
	}
	// The endpoint is reachable only from the peers the NetworkPolicy
	// names: by default the release's namespace (issue 37).
	if np := r.netpol; np == nil || !selects(np.Spec.PodSelector.MatchLabels, labels) || len(np.Spec.Ingress) != 1 ||
		len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil || np.Spec.Ingress[0].From[0].NamespaceSelector != nil ||
		np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9187 || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("network policy %+v", np)
	}
	if labels["outbox-cdc/pipeline"] != "orders-cdc" {
		t.Errorf("pod labels %v", labels)
	}

	// helm lint, with the same values.
	linter := lint.All(chartDir, required(), "data", false)
	for _, m := range linter.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		}
	}
}

func volume(t *testing.T, spec corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %q", name)
	return corev1.Volume{}
}

// selects reports whether selector matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestChartRequiresItsSettings: a release without a database or brokers
// fails at install with what to set, not in a crash loop.
func TestChartRequiresItsSettings(t *testing.T) {
	for _, tc := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"kafka": map[string]any{"brokers": []any{"k:9092"}}}, "postgres.url is required: --set postgres.url="},
		{map[string]any{"postgres": map[string]any{"url": "postgres://cdc@db/app"}}, "kafka.brokers is required"},
	} {
		if _, err := render(t, "orders-cdc", tc.vals); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("render %v: %v; want %q", tc.vals, err, tc.want)
		}
	}
}

// TestChartSecretsAreFiles: every secret is a file from a Secret, which
// the matching *_file key reads; none is in the ConfigMap, and one given
// in the values is refused.
func TestChartSecretsAreFiles(t *testing.T) {
	vals := merge(required(), map[string]any{
		"postgres": map[string]any{"passwordSecret": map[string]any{"name": "orders-pg"}, "caSecret": map[string]any{"name": "orders-db-ca"}},
		"kafka": map[string]any{
			"tls":  map[string]any{"enabled": true, "caSecret": map[string]any{"name": "kafka-ca"}, "clientSecret": "orders-kafka-client"},
			"sasl": map[string]any{"mechanism": "SCRAM-SHA-512", "username": "orders", "passwordSecret": map[string]any{"name": "orders-kafka", "key": "scram"}},
		},
		"checkpoint":     map[string]any{"signingKeySecret": map[string]any{"name": "cdc-signing"}},
		"metrics":        map[string]any{"tokenSecret": map[string]any{"name": "metrics-token"}, "serviceMonitor": map[string]any{"enabled": true}},
		"schemaRegistry": map[string]any{"passwordSecret": map[string]any{"name": "orders-registry"}, "caSecret": map[string]any{"name": "registry-ca"}},
		"config": map[string]any{
			"schema_registry": map[string]any{"url": "https://registry:8081", "basic_auth": map[string]any{"username": "orders"}},
			"tables":          []any{map[string]any{"name": "public.outbox", "schema": "avro"}},
		},
	})
	r := mustRender(t, "orders-cdc", vals)
	cm := r.configMap.Data["cdc.yaml"]
	wantFiles := map[string]string{ // config key → the Secret and key mounted there
		"password_file: /etc/cdc/secrets/postgres-password":        "orders-pg/password",
		"password_file: /etc/cdc/secrets/kafka-sasl-password":      "orders-kafka/scram",
		"signing_key_file: /etc/cdc/secrets/signing-key":           "cdc-signing/signing.key",
		"token_file: /etc/cdc/secrets/metrics-token":               "metrics-token/token",
		"ca_file: /etc/cdc/tls/kafka-ca.crt":                       "kafka-ca/ca.crt",
		"cert_file: /etc/cdc/tls/kafka-client.crt":                 "orders-kafka-client/tls.crt",
		"key_file: /etc/cdc/tls/kafka-client.key":                  "orders-kafka-client/tls.key",
		"sslrootcert=/etc/cdc/tls/postgres-ca.crt":                 "orders-db-ca/ca.crt",
		"password_file: /etc/cdc/secrets/schema-registry-password": "orders-registry/password",
		"ca_file: /etc/cdc/tls/schema-registry-ca.crt":             "registry-ca/ca.crt",
	}
	spec := r.deployment.Spec.Template.Spec
	mounted := map[string]string{} // file path → Secret/key
	for _, m := range spec.Containers[0].VolumeMounts {
		if !m.ReadOnly && m.MountPath != "/tmp" {
			t.Errorf("%s is mounted writable", m.MountPath)
		}
		v := volume(t, spec, m.Name)
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			for _, it := range src.Secret.Items {
				mounted[m.MountPath+"/"+it.Path] = src.Secret.Name + "/" + it.Key
			}
		}
	}
	for key, secret := range wantFiles {
		if !strings.Contains(cm, key) {
			t.Errorf("cdc.yaml lacks %q:\n%s", key, cm)
			continue
		}
		path := key[strings.IndexAny(key, ":=")+1:]
		if got := mounted[strings.TrimSpace(path)]; got != secret {
			t.Errorf("%s is from %q, want Secret %s", path, got, secret)
		}
	}
	cfg, lc := connectorConfig(t, r)
	if cfg.Kafka.SASL.Password != "" || lc.HTTP.Token != "" || strings.Contains(cfg.Postgres.URL, ":@") || cfg.Kafka.SASL.Username != "orders" {
		t.Errorf("a secret in the config: %+v", cfg.Kafka.SASL)
	}
	if sr := cfg.SchemaRegistry; sr.Password != "" || sr.Username != "orders" || sr.URL != "https://registry:8081" || cfg.Tables[0].Schema.Format != "avro" {
		t.Errorf("schema_registry from the chart: url %q user %q, a password set: %v; tables[0].schema %q", sr.URL, sr.Username, sr.Password != "", cfg.Tables[0].Schema.Format)
	}
	for _, env := range spec.Containers[0].Env {
		t.Errorf("environment variable %s: secrets are files", env.Name)
	}
	if ep := r.serviceMonitor.Spec.Endpoints; len(ep) != 1 || ep[0].Authorization == nil || ep[0].Authorization.Credentials.Name != "metrics-token" {
		t.Errorf("the ServiceMonitor does not send the metrics token: %+v", ep)
	}

	// A secret in the values would land in the ConfigMap: refused.
	for name, over := range map[string]map[string]any{
		"a password in the url":                      {"postgres": map[string]any{"url": "postgres://cdc:hunter2@db/app"}},
		"a password parameter":                       {"postgres": map[string]any{"url": "postgres://cdc@db/app?sslmode=require&password=hunter2"}},
		"config.kafka.sasl.password":                 {"config": map[string]any{"kafka": map[string]any{"sasl": map[string]any{"password": "hunter2"}}}},
		"config.http.token":                          {"config": map[string]any{"http": map[string]any{"token": "hunter2"}}},
		"config.schema_registry.basic_auth.password": {"config": map[string]any{"schema_registry": map[string]any{"basic_auth": map[string]any{"password": "hunter2"}}}},
	} {
		_, err := render(t, "orders-cdc", merge(required(), over))
		if err == nil || !strings.Contains(err.Error(), "ConfigMap") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v; want a refusal that names the ConfigMap and not the secret", name, err)
		}
	}
}

// TestChartSeedExamples renders the chart with each example's config as
// values, and the connector loads the same tables from the ConfigMap as
// from the example.
func TestChartSeedExamples(t *testing.T) {
	paths, _ := filepath.Glob("../../examples/*/cdc.yaml")
	if len(paths) < 5 {
		t.Fatalf("found %d examples", len(paths))
	}
	for _, path := range paths {
		t.Run(filepath.Base(filepath.Dir(path)), func(t *testing.T) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var ex map[string]any
			if err := yaml.Unmarshal(raw, &ex); err != nil {
				t.Fatal(err)
			}
			pg, _ := ex["postgres"].(map[string]any)
			kafka, _ := ex["kafka"].(map[string]any)
			delete(ex, "postgres")
			delete(ex, "kafka")
			r := mustRender(t, "seed", map[string]any{
				"postgres": map[string]any{"url": pg["url"]},
				"kafka":    map[string]any{"brokers": kafka["brokers"]},
				"config":   ex,
			})
			got, _ := connectorConfig(t, r)
			want, _, err := config.Load(path, config.Map())
			if err != nil {
				t.Fatal(err)
			}
			if err := want.Validate(); err != nil {
				t.Fatal(err)
			}
			// The filter and expressions are compared as written; what
			// Validate compiled from them holds functions, which
			// DeepEqual never finds equal.
			for _, tables := range [][]*outbox.Source{got.Tables, want.Tables} {
				for _, tbl := range tables {
					tbl.Programs = nil
				}
			}
			if !reflect.DeepEqual(got.Tables, want.Tables) || got.Delivery != want.Delivery || got.Replay != want.Replay {
				t.Errorf("the chart's config differs from %s:\n%s", path, r.configMap.Data["cdc.yaml"])
			}
		})
	}
}

// TestChartReleasesSideBySide: N releases in one namespace, one per
// database. Their objects do not collide, none selects another's pods,
// each pipeline is named after its release, and each alerts on its own
// pipeline only.
func TestChartReleasesSideBySide(t *testing.T) {
	alerts, err := os.ReadFile("../../examples/monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile(chartDir + "/files/alerts.yml")
	if err != nil || !bytes.Equal(alerts, copied) {
		t.Fatalf("deploy/helm/outbox-cdc/files/alerts.yml differs from examples/monitoring/alerts.yml: copy it again (%v)", err)
	}
	var want struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(alerts, &want); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	var releases []*release
	for _, name := range []string{"orders-cdc", "billing-cdc", "payments"} {
		r := mustRender(t, name, merge(required(), map[string]any{
			"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}},
		}))
		releases = append(releases, r)
		for i, o := range r.objects {
			id := r.kinds[i] + "/" + o.GetName()
			if other, ok := names[id]; ok {
				t.Errorf("%s of %s and %s collide", id, name, other)
			}
			names[id] = name
		}
		cfg, _ := connectorConfig(t, r)
		if cfg.Name != name {
			t.Errorf("release %s runs pipeline %q", name, cfg.Name)
		}
		// Releases on one server never share a slot (issue 38).
		if want := strings.ReplaceAll(name, "-", "_"); cfg.Postgres.Slot != want {
			t.Errorf("release %s streams slot %q, want %q", name, cfg.Postgres.Slot, want)
		}
		rules := r.rule.Spec.Groups[0].Rules
		if len(rules) != len(want.Groups[0].Rules) {
			t.Fatalf("%d rules, want %d", len(rules), len(want.Groups[0].Rules))
		}
		metric := regexp.MustCompile(`cdc_[a-z_]+(\{[^}]*\})?`)
		for i, rule := range rules {
			expr := rule.Expr.String()
			uses := metric.FindAllStringSubmatch(expr, -1)
			if len(uses) == 0 {
				t.Errorf("%s: %s uses no metric", rule.Alert, expr)
			}
			for _, u := range uses {
				if !strings.Contains(u[1], `pipeline="`+name+`"`) {
					t.Errorf("release %s, alert %s: %s is not scoped to its pipeline", name, rule.Alert, u[0])
				}
			}
			// Unscoped again, it is the example's rule.
			plain := regexp.MustCompile(`\{pipeline="[^"]*"\}|pipeline="[^"]*",`).ReplaceAllString(expr, "")
			if rule.Alert != want.Groups[0].Rules[i].Alert || plain != want.Groups[0].Rules[i].Expr {
				t.Errorf("rule %s: %q; the example's is %q", rule.Alert, plain, want.Groups[0].Rules[i].Expr)
			}
		}
	}
	for _, r := range releases {
		for _, other := range releases {
			if r != other && selects(r.deployment.Spec.Selector.MatchLabels, other.deployment.Spec.Template.Labels) {
				t.Errorf("release %s's Deployment selects the pods of %s", r.name, other.name)
			}
			if r != other && selects(r.serviceMonitor.Spec.Selector.MatchLabels, other.service.Labels) {
				t.Errorf("release %s's ServiceMonitor selects the Service of %s", r.name, other.name)
			}
		}
	}
}

// TestChartPackages: the chart packages as helm package makes it (the
// archive helm push sends to an OCI registry), and the archive loads and
// renders as the directory does.
func TestChartPackages(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := chartutil.Save(ch, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(archive) != "outbox-cdc-"+ch.Metadata.Version+".tgz" {
		t.Errorf("archive %s", archive)
	}
	packed, err := loader.Load(archive)
	if err != nil {
		t.Fatal(err)
	}
	if len(packed.Templates) != len(ch.Templates) || len(packed.Files) != len(ch.Files) || packed.Metadata.AppVersion != ch.Metadata.AppVersion {
		t.Errorf("the archive holds %d templates and %d files, the directory %d and %d", len(packed.Templates), len(packed.Files), len(ch.Templates), len(ch.Files))
	}
	for _, f := range packed.Files {
		if strings.HasSuffix(f.Name, ".tgz") {
			t.Errorf("the archive holds %s", f.Name)
		}
	}
}
