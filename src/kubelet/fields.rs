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
