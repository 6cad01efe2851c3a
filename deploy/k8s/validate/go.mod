module streams.local/deploy/k8s/validate

go 1.25.0

require (
	github.com/compose-spec/compose-go/v2 v2.16.2
	github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring v0.90.0
	github.com/prometheus/common v0.67.5
	github.com/prometheus/prometheus v0.310.0
	go.yaml.in/yaml/v2 v2.4.4
	k8s.io/api v0.35.10
	k8s.io/apiextensions-apiserver v0.35.2
	k8s.io/apimachinery v0.35.10
	k8s.io/kube-openapi v0.0.0-20260317180543-43fb72c5454a
	k8s.io/kubernetes v1.35.4
	sigs.k8s.io/kustomize/api v0.21.1
	sigs.k8s.io/kustomize/kyaml v0.21.1
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/blang/semver/v4 v4.0.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/dennwc/varint v1.0.0 // indirect
	github.com/distribution/reference v0.6.0 // indirect
	github.com/docker/go-connections v0.6.0 // indirect
	github.com/docker/go-units v0.5.0 // indirect
	github.com/fxamacker/cbor/v2 v2.9.0 // indirect
	github.com/go-errors/errors v1.4.2 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-openapi/jsonpointer v0.22.4 // indirect
	github.com/go-openapi/jsonreference v0.21.4 // indirect
	github.com/go-openapi/swag v0.25.4 // indirect
	github.com/go-openapi/swag/cmdutils v0.25.4 // indirect
	github.com/go-openapi/swag/conv v0.25.4 // indirect
	github.com/go-openapi/swag/fileutils v0.25.4 // indirect
	github.com/go-openapi/swag/jsonname v0.25.4 // indirect
	github.com/go-openapi/swag/jsonutils v0.25.4 // indirect
	github.com/go-openapi/swag/loading v0.25.4 // indirect
	github.com/go-openapi/swag/mangling v0.25.4 // indirect
	github.com/go-openapi/swag/netutils v0.25.4 // indirect
	github.com/go-openapi/swag/stringutils v0.25.4 // indirect
	github.com/go-openapi/swag/typeutils v0.25.4 // indirect
	github.com/go-openapi/swag/yamlutils v0.25.4 // indirect
	github.com/go-viper/mapstructure/v2 v2.5.0 // indirect
	github.com/google/gnostic-models v0.7.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/grafana/regexp v0.0.0-20250905093917-f7b3be9d1853 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/mattn/go-shellwords v1.0.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/monochromegane/go-gitignore v0.0.0-20200626010858-205db1a8cc00 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.2 // indirect
	github.com/sirupsen/logrus v1.10.1 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/stretchr/objx v0.5.3 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	github.com/xhit/go-str2duration/v2 v2.1.0 // indirect
	github.com/xlab/treeprint v1.2.0 // indirect
	go.opentelemetry.io/otel v1.41.0 // indirect
	go.opentelemetry.io/otel/trace v1.41.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	go.yaml.in/yaml/v4 v4.0.0-rc.4 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sync v0.21.0 // indirect
	golang.org/x/sys v0.46.0 // indirect
	golang.org/x/text v0.39.0 // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
	gopkg.in/evanphx/json-patch.v4 v4.13.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	k8s.io/apiserver v0.35.4 // indirect
	k8s.io/client-go v0.35.4 // indirect
	k8s.io/component-base v0.35.4 // indirect
	k8s.io/component-helpers v0.0.0 // indirect
	k8s.io/controller-manager v0.0.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/kubelet v0.0.0 // indirect
	k8s.io/utils v0.0.0-20260210185600-b8788abfbbc2 // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
	sigs.k8s.io/randfill v1.0.0 // indirect
	sigs.k8s.io/structured-merge-diff/v6 v6.3.2 // indirect
)

replace k8s.io/api => k8s.io/api v0.35.4

replace k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.35.4

replace k8s.io/apimachinery => k8s.io/apimachinery v0.35.4

replace k8s.io/apiserver => k8s.io/apiserver v0.35.4

replace k8s.io/cli-runtime => k8s.io/cli-runtime v0.35.4

replace k8s.io/client-go => k8s.io/client-go v0.35.4

replace k8s.io/cloud-provider => k8s.io/cloud-provider v0.35.4

replace k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.35.4

replace k8s.io/code-generator => k8s.io/code-generator v0.35.4

replace k8s.io/component-base => k8s.io/component-base v0.35.4

replace k8s.io/component-helpers => k8s.io/component-helpers v0.35.4

replace k8s.io/controller-manager => k8s.io/controller-manager v0.35.4

replace k8s.io/cri-api => k8s.io/cri-api v0.35.4

replace k8s.io/cri-client => k8s.io/cri-client v0.35.4

replace k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.35.4

replace k8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation v0.35.4

replace k8s.io/endpointslice => k8s.io/endpointslice v0.35.4

replace k8s.io/externaljwt => k8s.io/externaljwt v0.35.4

replace k8s.io/kms => k8s.io/kms v0.35.4

replace k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.35.4

replace k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.35.4

replace k8s.io/kube-proxy => k8s.io/kube-proxy v0.35.4

replace k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.35.4

replace k8s.io/kubectl => k8s.io/kubectl v0.35.4

replace k8s.io/kubelet => k8s.io/kubelet v0.35.4

replace k8s.io/metrics => k8s.io/metrics v0.35.4

replace k8s.io/mount-utils => k8s.io/mount-utils v0.35.4

replace k8s.io/pod-security-admission => k8s.io/pod-security-admission v0.35.4

replace k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.35.4
