//! KubeletConfiguration (`kubelet.config.k8s.io/v1beta1`) field names and the kubelet
//! flags that override them.
//!
//! The kubelet lets a command-line flag win over the same setting in its config file
//! (`cmd/kubelet/app/options/options.go`, `AddKubeletConfigFlags`): a partial config whose
//! field is also set as a flag would change nothing, so coverage must say so. Flag names
//! follow the kubelet's registration, which is mostly the field in kebab case with a few
//! historical exceptions listed here.

/// Top-level fields of KubeletConfiguration v1beta1 (Kubernetes 1.34), sorted.
const FIELDS: &[&str] = &[
    "address",
    "allowedUnsafeSysctls",
    "authentication",
    "authorization",
    "cgroupDriver",
    "cgroupRoot",
    "cgroupsPerQOS",
    "clusterDNS",
    "clusterDomain",
    "configMapAndSecretChangeDetectionStrategy",
    "containerLogMaxFiles",
    "containerLogMaxSize",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "containerRuntimeEndpoint",
    "contentType",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "crashLoopBackOff",
    "enableContentionProfiling",
    "enableControllerAttachDetach",
    "enableDebugFlagsHandler",
    "enableDebuggingHandlers",
    "enableProfilingHandler",
    "enableServer",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "enforceNodeAllocatable",
    "eventBurst",
    "eventRecordQPS",
    "evictionHard",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "failCgroupV1",
    "failSwapOn",
    "featureGates",
    "fileCheckFrequency",
    "hairpinMode",
    "healthzBindAddress",
    "healthzPort",
    "httpCheckFrequency",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "imageMaximumGCAge",
    "imageMinimumGCAge",
    "imagePullCredentialsVerificationPolicy",
    "imageServiceEndpoint",
    "iptablesDropBit",
    "iptablesMasqueradeBit",
    "kernelMemcgNotification",
    "kubeAPIBurst",
    "kubeAPIQPS",
    "kubeReserved",
    "kubeReservedCgroup",
    "kubeletCgroups",
    "localStorageCapacityIsolation",
    "logging",
    "makeIPTablesUtilChains",
    "maxOpenFiles",
    "maxParallelImagePulls",
    "maxPods",
    "memoryManagerPolicy",
    "memorySwap",
    "memoryThrottlingFactor",
    "mergeDefaultEvictionSettings",
    "nodeLeaseDurationSeconds",
    "nodeStatusMaxImages",
    "nodeStatusReportFrequency",
    "nodeStatusUpdateFrequency",
    "oomScoreAdj",
    "podCIDR",
    "podLogsDir",
    "podPidsLimit",
    "podsPerCore",
    "port",
    "preloadedImagesVerificationAllowlist",
    "protectKernelDefaults",
    "providerID",
    "qosReserved",
    "readOnlyPort",
    "registerNode",
    "registerWithTaints",
    "registryBurst",
    "registryPullQPS",
    "reservedMemory",
    "reservedSystemCPUs",
    "resolvConf",
    "rotateCertificates",
    "runOnce",
    "runtimeRequestTimeout",
    "seccompDefault",
    "serializeImagePulls",
    "serverTLSBootstrap",
    "showHiddenMetricsForVersion",
    "shutdownGracePeriod",
    "shutdownGracePeriodByPodPriority",
    "shutdownGracePeriodCriticalPods",
    "singleProcessOOMKill",
    "staticPodPath",
    "staticPodURL",
    "staticPodURLHeader",
    "streamingConnectionIdleTimeout",
    "syncFrequency",
    "systemCgroups",
    "systemReserved",
    "systemReservedCgroup",
    "tlsCertFile",
    "tlsCipherSuites",
    "tlsMinVersion",
    "tlsPrivateKeyFile",
    "topologyManagerPolicy",
    "topologyManagerPolicyOptions",
    "topologyManagerScope",
    "tracing",
    "userNamespaces",
    "volumePluginDir",
    "volumeStatsAggPeriod",
];

/// Fields whose flag is not their kebab-case name, or that live below the top level.
const IRREGULAR: &[(&str, &str)] = &[
    ("authentication.anonymous.enabled", "anonymous-auth"),
    (
        "authentication.webhook.cacheTTL",
        "authentication-token-webhook-cache-ttl",
    ),
    (
        "authentication.webhook.enabled",
        "authentication-token-webhook",
    ),
    ("authentication.x509.clientCAFile", "client-ca-file"),
    ("authorization.mode", "authorization-mode"),
    (
        "authorization.webhook.cacheAuthorizedTTL",
        "authorization-webhook-cache-authorized-ttl",
    ),
    (
        "authorization.webhook.cacheUnauthorizedTTL",
        "authorization-webhook-cache-unauthorized-ttl",
    ),
    ("cgroupsPerQOS", "cgroups-per-qos"),
    ("clusterDNS", "cluster-dns"),
    ("cpuCFSQuota", "cpu-cfs-quota"),
    ("cpuCFSQuotaPeriod", "cpu-cfs-quota-period"),
    ("eventRecordQPS", "event-qps"),
    ("imageGCHighThresholdPercent", "image-gc-high-threshold"),
    ("imageGCLowThresholdPercent", "image-gc-low-threshold"),
    ("kubeAPIBurst", "kube-api-burst"),
    ("kubeAPIQPS", "kube-api-qps"),
    ("makeIPTablesUtilChains", "make-iptables-util-chains"),
    ("podCIDR", "pod-cidr"),
    ("podPidsLimit", "pod-max-pids"),
    ("providerID", "provider-id"),
    ("registryPullQPS", "registry-qps"),
    ("reservedSystemCPUs", "reserved-cpus"),
    ("staticPodPath", "pod-manifest-path"),
    ("staticPodURL", "manifest-url"),
    ("staticPodURLHeader", "manifest-url-header"),
    ("tlsCertFile", "tls-cert-file"),
    ("tlsPrivateKeyFile", "tls-private-key-file"),
];

/// Fields with no overriding flag at any depth (only settable in the file).
const NO_FLAG: &[&str] = &[
    "authentication",
    "authorization",
    "crashLoopBackOff",
    "logging",
    "memorySwap",
    "shutdownGracePeriodByPodPriority",
    "tracing",
    "userNamespaces",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "enableDebugFlagsHandler",
    "enableProfilingHandler",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "mergeDefaultEvictionSettings",
    "singleProcessOOMKill",
    "failCgroupV1",
];

/// True if `field` is a top-level KubeletConfiguration v1beta1 field.
pub fn is_known(field: &str) -> bool {
    FIELDS.binary_search(&field).is_ok()
}

/// Why `field` is refused as a top-level KubeletConfiguration field, for coverage's
/// reason and `inplacectl validate`: a field the kubelet does not know, with the known
/// field it most likely means when one matches it ignoring case, `-` and `_`
/// (`maxpods`, `max_pods` → `maxPods`; the kubelet's own decoder is case-sensitive, so
/// these are refused there too).
pub fn unknown_field_message(field: &str) -> String {
    let fold = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '-' && *c != '_')
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let folded = fold(field);
    let hint = FIELDS
        .iter()
        .find(|f| fold(f) == folded)
        .map(|f| format!(" (did you mean {f}?)"))
        .unwrap_or_default();
    format!(
        "{field} is not a KubeletConfiguration (kubelet.config.k8s.io/v1beta1) field{hint}; check the spelling: the kubelet ignores or refuses unknown fields"
    )
}

/// Kebab case as the kubelet names flags: a capital after a lower-case letter or digit,
/// or a capital followed by a lower-case letter after capitals, starts a word
/// (`maxPods` → `max-pods`, `imageGCHighThresholdPercent` → `image-gc-high-threshold-percent`).
pub fn kebab(field: &str) -> String {
    let chars: Vec<char> = field.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev.is_ascii_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_ascii_uppercase() && next_lower)
            {
                out.push('-');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The kubelet flag that overrides the field at `path`, if any.
pub fn flag_for(path: &[String]) -> Option<String> {
    let dotted = path.join(".");
    // the longest irregular entry that is a prefix of (or equal to) the path
    if let Some((_, f)) = IRREGULAR
        .iter()
        .filter(|(k, _)| dotted == *k || dotted.starts_with(&format!("{k}.")))
        .max_by_key(|(k, _)| k.len())
    {
        return Some(f.to_string());
    }
    let top = path.first()?;
    if NO_FLAG.contains(&top.as_str()) {
        return None;
    }
    Some(kebab(top))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<String> {
        s.split('.').map(str::to_string).collect()
    }

    #[test]
    fn an_unknown_field_names_the_known_one_it_folds_to() {
        for typo in ["maxpods", "MaxPods", "max_pods", "max-pods"] {
            let m = unknown_field_message(typo);
            assert!(
                m.starts_with(&format!("{typo} is not a KubeletConfiguration")),
                "{m}"
            );
            assert!(m.contains("(did you mean maxPods?)"), "{m}");
        }
        // nothing near: no guess
        let m = unknown_field_message("maxPodz");
        assert!(!m.contains("did you mean"), "{m}");
        assert!(m.contains("check the spelling"), "{m}");
    }

    #[test]
    fn fields_are_sorted_for_binary_search() {
        let mut sorted = FIELDS.to_vec();
        sorted.sort();
        assert_eq!(sorted, FIELDS);
    }

    #[test]
    fn flag_names() {
        assert_eq!(flag_for(&p("maxPods")).unwrap(), "max-pods");
        assert_eq!(flag_for(&p("kubeAPIQPS")).unwrap(), "kube-api-qps");
        assert_eq!(flag_for(&p("clusterDNS")).unwrap(), "cluster-dns");
        assert_eq!(
            flag_for(&p("systemReserved.cpu")).unwrap(),
            "system-reserved"
        );
        assert_eq!(
            flag_for(&p("evictionHard.memory")).unwrap(),
            "eviction-hard"
        );
        assert_eq!(
            flag_for(&p("authentication.x509.clientCAFile")).unwrap(),
            "client-ca-file"
        );
        assert_eq!(
            flag_for(&p("authorization.mode")).unwrap(),
            "authorization-mode"
        );
        assert_eq!(flag_for(&p("reservedSystemCPUs")).unwrap(), "reserved-cpus");
        assert_eq!(
            flag_for(&p("containerRuntimeEndpoint")).unwrap(),
            "container-runtime-endpoint"
        );
        assert_eq!(flag_for(&p("logging.verbosity")), None);
        assert_eq!(
            kebab("imageGCHighThresholdPercent"),
            "image-gc-high-threshold-percent"
        );
        assert!(is_known("maxPods") && !is_known("maxPodz"));
    }
}

/// The type of a KubeletConfiguration field as the kubelet decodes it, from the Go types
/// of `k8s.io/kubelet/config/v1beta1` (`types.go`, `KubeletConfiguration` and the
/// structs it embeds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// `string` (and string enums).
    Str,
    /// `metav1.Duration`: a Go duration string such as `5m0s`.
    Duration,
    /// `bool` / `*bool`.
    Bool,
    /// `int32` / `int64`.
    Int,
    /// `float64`.
    Float,
    /// `map[string]string` (eviction thresholds, reservations, policy options).
    MapOfStr,
    /// `map[string]bool` (`featureGates`).
    MapOfBool,
    /// `[]string`.
    ListOfStr,
    /// `[]int32`.
    ListOfInt,
}

impl FieldType {
    /// What a value of this type looks like, for messages.
    pub fn expected(self) -> &'static str {
        match self {
            FieldType::Str => "a string",
            FieldType::Duration => "a duration string such as \"5m0s\"",
            FieldType::Bool => "a boolean (true or false)",
            FieldType::Int => "an integer",
            FieldType::Float => "a number",
            FieldType::MapOfStr => "a map of strings",
            FieldType::MapOfBool => "a map of booleans",
            FieldType::ListOfStr => "a list of strings",
            FieldType::ListOfInt => "a list of integers",
        }
    }

    /// True when `v` (JSON, as the spec carries it) is of this type.
    pub fn accepts(self, v: &serde_json::Value) -> bool {
        use serde_json::Value;
        let int = |v: &Value| v.as_f64().is_some_and(|f| f.fract() == 0.0);
        match self {
            FieldType::Str | FieldType::Duration => v.is_string(),
            FieldType::Bool => v.is_boolean(),
            FieldType::Int => int(v),
            FieldType::Float => v.is_number(),
            FieldType::MapOfStr => v
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_string)),
            FieldType::MapOfBool => v
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_boolean)),
            FieldType::ListOfStr => v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
            FieldType::ListOfInt => v.as_array().is_some_and(|a| a.iter().all(int)),
        }
    }
}

/// Field types by JSON path (`a` or `a.b.c`); fields not listed (logging, tracing,
/// reservedMemory, registerWithTaints, ...) are not checked here.
const TYPES: &[(&str, FieldType)] = {
    use FieldType::*;
    &[
        ("address", Str),
        ("allowedUnsafeSysctls", ListOfStr),
        ("authentication.anonymous.enabled", Bool),
        ("authentication.webhook.cacheTTL", Duration),
        ("authentication.webhook.enabled", Bool),
        ("authentication.x509.clientCAFile", Str),
        ("authorization.mode", Str),
        ("authorization.webhook.cacheAuthorizedTTL", Duration),
        ("authorization.webhook.cacheUnauthorizedTTL", Duration),
        ("cgroupDriver", Str),
        ("cgroupRoot", Str),
        ("cgroupsPerQOS", Bool),
        ("clusterDNS", ListOfStr),
        ("clusterDomain", Str),
        ("configMapAndSecretChangeDetectionStrategy", Str),
        ("containerLogMaxFiles", Int),
        ("containerLogMaxSize", Str),
        ("containerLogMaxWorkers", Int),
        ("containerLogMonitorInterval", Duration),
        ("containerRuntimeEndpoint", Str),
        ("contentType", Str),
        ("cpuCFSQuota", Bool),
        ("cpuCFSQuotaPeriod", Duration),
        ("cpuManagerPolicy", Str),
        ("cpuManagerPolicyOptions", MapOfStr),
        ("cpuManagerReconcilePeriod", Duration),
        ("crashLoopBackOff.maxContainerRestartPeriod", Duration),
        ("draManagerReconcilePeriod", Duration),
        ("enableContentionProfiling", Bool),
        ("enableControllerAttachDetach", Bool),
        ("enableDebugFlagsHandler", Bool),
        ("enableDebuggingHandlers", Bool),
        ("enableProfilingHandler", Bool),
        ("enableServer", Bool),
        ("enableSystemLogHandler", Bool),
        ("enableSystemLogQuery", Bool),
        ("enforceNodeAllocatable", ListOfStr),
        ("eventBurst", Int),
        ("eventRecordQPS", Int),
        ("evictionHard", MapOfStr),
        ("evictionMaxPodGracePeriod", Int),
        ("evictionMinimumReclaim", MapOfStr),
        ("evictionPressureTransitionPeriod", Duration),
        ("evictionSoft", MapOfStr),
        ("evictionSoftGracePeriod", MapOfStr),
        ("failCgroupV1", Bool),
        ("failSwapOn", Bool),
        ("featureGates", MapOfBool),
        ("fileCheckFrequency", Duration),
        ("hairpinMode", Str),
        ("healthzBindAddress", Str),
        ("healthzPort", Int),
        ("httpCheckFrequency", Duration),
        ("imageGCHighThresholdPercent", Int),
        ("imageGCLowThresholdPercent", Int),
        ("imageMaximumGCAge", Duration),
        ("imageMinimumGCAge", Duration),
        ("imagePullCredentialsVerificationPolicy", Str),
        ("imageServiceEndpoint", Str),
        ("iptablesDropBit", Int),
        ("iptablesMasqueradeBit", Int),
        ("kernelMemcgNotification", Bool),
        ("kubeAPIBurst", Int),
        ("kubeAPIQPS", Int),
        ("kubeReserved", MapOfStr),
        ("kubeReservedCgroup", Str),
        ("kubeletCgroups", Str),
        ("localStorageCapacityIsolation", Bool),
        ("makeIPTablesUtilChains", Bool),
        ("maxOpenFiles", Int),
        ("maxParallelImagePulls", Int),
        ("maxPods", Int),
        ("memoryManagerPolicy", Str),
        ("memoryReservationPolicy", Str),
        ("memorySwap.swapBehavior", Str),
        ("memoryThrottlingFactor", Float),
        ("mergeDefaultEvictionSettings", Bool),
        ("nodeLeaseDurationSeconds", Int),
        ("nodeStatusMaxImages", Int),
        ("nodeStatusReportFrequency", Duration),
        ("nodeStatusUpdateFrequency", Duration),
        ("oomScoreAdj", Int),
        ("podCIDR", Str),
        ("podLogsDir", Str),
        ("podPidsLimit", Int),
        ("podsPerCore", Int),
        ("port", Int),
        ("preloadedImagesVerificationAllowlist", ListOfStr),
        ("protectKernelDefaults", Bool),
        ("providerID", Str),
        ("qosReserved", MapOfStr),
        ("readOnlyPort", Int),
        ("registerNode", Bool),
        ("registryBurst", Int),
        ("registryPullQPS", Int),
        ("reservedSystemCPUs", Str),
        ("resolvConf", Str),
        ("rotateCertificates", Bool),
        ("runOnce", Bool),
        ("runtimeRequestTimeout", Duration),
        ("seccompDefault", Bool),
        ("serializeImagePulls", Bool),
        ("serverTLSBootstrap", Bool),
        ("showHiddenMetricsForVersion", Str),
        ("shutdownGracePeriod", Duration),
        ("shutdownGracePeriodCriticalPods", Duration),
        ("singleProcessOOMKill", Bool),
        ("staticPodPath", Str),
        ("staticPodURL", Str),
        ("streamingConnectionIdleTimeout", Duration),
        ("syncFrequency", Duration),
        ("systemCgroups", Str),
        ("systemReserved", MapOfStr),
        ("systemReservedCgroup", Str),
        ("tlsCertFile", Str),
        ("tlsCipherSuites", ListOfStr),
        ("tlsCurvePreferences", ListOfInt),
        ("tlsMinVersion", Str),
        ("tlsPrivateKeyFile", Str),
        ("topologyManagerPolicy", Str),
        ("topologyManagerPolicyOptions", MapOfStr),
        ("topologyManagerScope", Str),
        ("userNamespaces.idsPerPod", Int),
        ("volumePluginDir", Str),
        ("volumeStatsAggPeriod", Duration),
    ]
};

/// The type of the field at `path` (`["evictionHard"]`, `["authentication", "webhook",
/// "enabled"]`), if the table knows it.
pub fn field_type(path: &[String]) -> Option<FieldType> {
    let key = path.join(".");
    TYPES.iter().find(|(p, _)| *p == key).map(|(_, t)| *t)
}

/// Checks every field of a partial KubeletConfiguration against its Go type: a value
/// YAML read as another type (`no` as a boolean for a string, `0644` as a number) is
/// refused with the field (`evictionHard["memory.available"]`) and what was expected,
/// never written as something else. Returns (field, message).
pub fn check_types(
    partial: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), (String, String)> {
    for (k, v) in partial {
        check_at(&mut vec![k.clone()], v)?;
    }
    Ok(())
}

fn check_at(path: &mut Vec<String>, v: &serde_json::Value) -> Result<(), (String, String)> {
    let Some(t) = field_type(path) else {
        if let Some(m) = v.as_object() {
            for (k, x) in m {
                path.push(k.clone());
                check_at(path, x)?;
                path.pop();
            }
        }
        return Ok(());
    };
    if t.accepts(v) {
        return Ok(());
    }
    // a map of the right shape with one value of the wrong type: name that entry
    let entry = match (t, v.as_object()) {
        (FieldType::MapOfStr, Some(m)) => m
            .iter()
            .find(|(_, x)| !x.is_string())
            .map(|(k, x)| (k, x, FieldType::Str)),
        (FieldType::MapOfBool, Some(m)) => m
            .iter()
            .find(|(_, x)| !x.is_boolean())
            .map(|(k, x)| (k, x, FieldType::Bool)),
        _ => None,
    };
    let (field, value, want) = match entry {
        Some((k, x, want)) => (format!("{}[{k:?}]", path.join(".")), x, want),
        None => (path.join("."), v, t),
    };
    let hint = if want == FieldType::Str {
        "; quote it (\"no\", \"0644\") so that YAML keeps it a string"
    } else {
        ""
    };
    Err((
        field,
        format!(
            "is {value}, but the kubelet reads this field as {}{hint}",
            want.expected()
        ),
    ))
}
