//! The kubelet's CPU and memory manager checkpoints, and the settings that invalidate
//! them.

/// Kubelet checkpoints invalidated by a change of these fields (`flags` = kubelet flag
/// names, else KubeletConfiguration field names): the kubelet refuses to start when the
/// CPU or memory manager policy or its reserved set no longer matches its checkpoint. The
/// topology manager's policy, scope and options decide how both managers align their
/// assignments, so a change of them invalidates both checkpoints.
///
/// Returns node paths under `/var/lib/kubelet`, in the order the names ask for them (a
/// path may repeat; callers collect them into a set).
pub fn kubelet_state_files(names: &[&str], flags: bool) -> Vec<String> {
    let mut out = Vec::new();
    for n in names {
        let (cpu, mem) = if flags {
            let topology = matches!(
                *n,
                "topology-manager-policy"
                    | "topology-manager-scope"
                    | "topology-manager-policy-options"
            );
            (
                topology
                    || matches!(
                        *n,
                        "cpu-manager-policy" | "cpu-manager-policy-options" | "reserved-cpus"
                    ),
                topology || matches!(*n, "memory-manager-policy" | "reserved-memory"),
            )
        } else {
            let topology = matches!(
                *n,
                "topologyManagerPolicy" | "topologyManagerScope" | "topologyManagerPolicyOptions"
            );
            (
                topology
                    || matches!(
                        *n,
                        "cpuManagerPolicy" | "cpuManagerPolicyOptions" | "reservedSystemCPUs"
                    ),
                topology || matches!(*n, "memoryManagerPolicy" | "reservedMemory"),
            )
        };
        if cpu {
            out.push("/var/lib/kubelet/cpu_manager_state".to_string());
        }
        if mem {
            out.push("/var/lib/kubelet/memory_manager_state".to_string());
        }
    }
    out
}
