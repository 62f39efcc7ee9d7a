//! The test control plane itself (tests/k8s/harness.rs), against the real kube-apiserver
//! v1.20: it serves the Machine CRD and `policy` only as v1beta1 (why the extension picks
//! the Eviction version by discovery), the disruption controller computes budgets, and the
//! `inplace-extension` user holds exactly the shipped RBAC (deploy/extension-rbac.yaml).
//! Run by tests/k8s/run.sh (`--ignored`).

mod common;
#[path = "k8s/harness.rs"]
mod harness;
#[path = "k8s/kubelet.rs"]
mod kubelet;

use harness::Cluster;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::Api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn control_plane_serves_what_the_tests_rely_on() {
    let c = Cluster::start().await;
    let admin = c.admin().await;
    let v = admin.apiserver_version().await.unwrap();
    assert_eq!((v.major.as_str(), v.minor.as_str()), ("1", "20"), "{v:?}");
    let policy = kube::discovery::group(&admin, "policy").await.unwrap();
    let versions: Vec<&str> = policy.versions().collect();
    assert_eq!(versions, ["v1beta1"], "v1.20 serves policy only as v1beta1");

    // a budget the disruption controller computes
    kubelet::node(&c, "n1", "boot-1").await;
    kubelet::replicated(&c, "web", &["n1", "n1"], 1).await;
    let allowed = kubelet::wait_budget(&c, "web", |a| a == 1).await;
    assert_eq!(allowed, 1);

    // the extension's user: exactly the shipped RBAC
    let ext = harness::client_of(&c.ext_kubeconfig).await.unwrap();
    Api::<Node>::all(ext.clone()).get("n1").await.unwrap();
    let e = Api::<Node>::all(ext.clone())
        .delete("n1", &Default::default())
        .await
        .unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 403), "{e}");
    let e = Api::<Secret>::all(ext.clone())
        .list(&Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 403),
        "secrets are get-only: {e}"
    );
}
