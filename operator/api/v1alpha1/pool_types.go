package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// LabelPool is the label every Proxy of a ProxyPool carries, with the pool's name as its
// value: the pool's status.selector (what `kubectl scale`, an HPA and KEDA read) selects by
// it, and the pool lists its Proxies by it.
const LabelPool = "crawl.example.com/pool"

// MaxPoolReplicas bounds a pool's size, so one reconcile of it (a list of its Proxies, a
// plan over them) stays bounded; the schema refuses more, as spec.replicas' Maximum.
const MaxPoolReplicas = 20000

// ProxyPoolSpec is the desired state of a pool of identical Managed proxies.
//
// +kubebuilder:validation:XValidation:rule="!has(self.autoscale) || !has(self.autoscale.maxReplicas) || !has(self.autoscale.minReplicas) || self.autoscale.minReplicas <= self.autoscale.maxReplicas",message="spec.autoscale.minReplicas must not exceed spec.autoscale.maxReplicas"
type ProxyPoolSpec struct {
	// Replicas is how many Proxies the pool keeps. With spec.autoscale the pool's
	// autoscaler writes it, as a HorizontalPodAutoscaler writes a Deployment's: a
	// `kubectl scale` then lasts until its next decision.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=20000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Template is what each of the pool's Proxies is made from. Its attributes are the
	// pool's selector: crawlers lease from the pool by asking for them.
	Template ProxyTemplate `json:"template"`

	// Strategy bounds how many Proxies a change replaces at once.
	// +optional
	Strategy PoolStrategy `json:"strategy,omitempty"`

	// Autoscale sizes the pool by the leases crawlers ask of it, down to minReplicas (which
	// may be zero: an idle pool then costs no instance).
	// +optional
	Autoscale *PoolAutoscale `json:"autoscale,omitempty"`
}

// ProxyTemplate is a Proxy without a name: the pool names its Proxies after itself.
type ProxyTemplate struct {
	// Labels and annotations given to each Proxy, beside the pool's own label.
	// +optional
	Metadata TemplateMetadata `json:"metadata,omitempty"`

	// Spec of each Proxy. Only Managed proxies can be pooled: an External endpoint is one
	// address, which copies would not multiply.
	// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode == 'Managed'",message="spec.template.spec.mode must be Managed: an External endpoint cannot be multiplied by a pool"
	Spec ProxySpec `json:"spec"`
}

// TemplateMetadata is the part of a Proxy's metadata a template sets.
type TemplateMetadata struct {
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Keys under crawl.example.com/ are the operator's (a pool's grants live there).
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('crawl.example.com/'))",message="spec.template.metadata.annotations: keys under crawl.example.com/ are the operator's"
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PoolStrategy is a rolling change's budget, with a Deployment's meaning and defaults.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.maxSurge) && has(self.maxUnavailable) && (self.maxSurge == 0 || self.maxSurge == '0%') && (self.maxUnavailable == 0 || self.maxUnavailable == '0%'))",message="spec.strategy.maxSurge and spec.strategy.maxUnavailable cannot both be zero: nothing could be replaced"
type PoolStrategy struct {
	// MaxSurge is how many instances beyond replicas may exist while Proxies are replaced
	// (a count, or a percentage of replicas rounded up; default 25%). Every replacement
	// counts against it, whatever drives it: a template change, a cloud-init rotation,
	// maxAge, bans or ill health.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]{1,3}%$')",message="spec.strategy.maxSurge must be a non-negative count or a percentage such as 25%"
	// +optional
	MaxSurge *intstr.IntOrString `json:"maxSurge,omitempty"`

	// MaxUnavailable is how many Proxies may be without a serving instance during a
	// replacement (a count, or a percentage of replicas rounded down; default 25%). With
	// maxSurge 0, Proxies are replaced delete-first, this many at a time.
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]{1,3}%$')",message="spec.strategy.maxUnavailable must be a non-negative count or a percentage such as 25%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// PoolAutoscale sizes a pool by lease demand.
type PoolAutoscale struct {
	// MinReplicas is the fewest Proxies the pool keeps; zero lets an idle pool cost no
	// instance (the first request for it then waits while one starts).
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=20000
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// MaxReplicas is the most Proxies the pool grows to.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20000
	MaxReplicas int32 `json:"maxReplicas"`

	// TargetUtilization is the share of the pool's lease capacity (replicas × maxLeases)
	// that demand (leases held, refused, and requests waiting) should fill, in percent.
	// +kubebuilder:default=80
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	TargetUtilization int32 `json:"targetUtilization,omitempty"`

	// ScaleDownDelay is how long demand must have stayed lower before the pool shrinks to
	// it (an HPA's scale-down stabilization window; default 5m).
	// +kubebuilder:default="5m"
	// +optional
	ScaleDownDelay Duration `json:"scaleDownDelay,omitempty"`
}

// ProxyPoolStatus is written by the operator: the pool controller's counts and conditions,
// and with spec.autoscale its autoscaler's demand and scaling conditions.
type ProxyPoolStatus struct {
	// Replicas is how many Proxies the pool has now (the scale subresource's status).
	// +optional
	Replicas int32 `json:"replicas"`
	// ReadyReplicas is how many of them are Ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// UpdatedReplicas is how many run the current template.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`
	// LeasedReplicas is how many had a crawler lease at the autoscaler's last look; unset
	// without spec.autoscale, whose autoscaler alone asks discovery (kubectl then shows
	// <none> rather than a 0 that would mislead).
	// +optional
	LeasedReplicas *int32 `json:"leasedReplicas,omitempty"`
	// Demand is the leases crawlers wanted of the pool at the autoscaler's last look:
	// held, waiting for a proxy, and refused one lately (discovery's GET /v1/demand).
	// +optional
	Demand *int32 `json:"demand,omitempty"`
	// DesiredReplicas is the autoscaler's last decision (spec.replicas without autoscale).
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas"`
	// Selector is the label selector of the pool's Proxies, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`
	// ObservedGeneration is the spec generation the pool's workflow has applied.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// LastScaleTime is when the pool last changed its size.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`
	// WorkflowID is the Temporal workflow that drives the pool.
	// +optional
	WorkflowID string `json:"workflowID,omitempty"`
	// Conditions: Available (at least replicas − maxUnavailable Proxies are Ready),
	// Progressing (a rollout or a scale is under way, and why), and with spec.autoscale
	// ScalingActive (the autoscaler reads the pool's demand from discovery, or why not)
	// and ScalingLimited (it wants more or fewer than its bounds allow).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types of a ProxyPool.
const (
	PoolConditionAvailable      = "Available"
	PoolConditionProgressing    = "Progressing"
	PoolConditionScalingActive  = "ScalingActive"
	PoolConditionScalingLimited = "ScalingLimited"
)

// ProxyPool keeps a number of identical Proxies, replaces them within a budget and, with
// spec.autoscale, sizes them by the leases crawlers ask for.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=pxp,categories=crawl
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Leased",type=integer,JSONPath=`.status.leasedReplicas`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updatedReplicas`,priority=1
// +kubebuilder:printcolumn:name="Demand",type=integer,JSONPath=`.status.demand`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProxyPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProxyPoolSpec   `json:"spec"`
	Status ProxyPoolStatus `json:"status,omitempty"`
}

// ProxyPoolList is a list of ProxyPools.
//
// +kubebuilder:object:root=true
type ProxyPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyPool `json:"items"`
}
