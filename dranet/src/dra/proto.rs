//! Generated gRPC code for the kubelet APIs (see `build.rs`).
#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod pluginregistration {
    include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));
}

pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/k8s.io.kubelet.pkg.apis.dra.v1.rs"));
}

pub mod v1beta1 {
    include!(concat!(
        env!("OUT_DIR"),
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs"
    ));
}

/// KEP-4680 device health (`pkg/apis/dra-health/v1alpha1`, proto package `v1alpha1`).
pub mod health_v1alpha1 {
    include!(concat!(env!("OUT_DIR"), "/v1alpha1.rs"));
}

/// KEP-4680 device health, v1 (`pkg/apis/dra-health/v1`, proto package `v1`; kubelet after
/// 1.36): the messages of v1alpha1 under another package name.
pub mod health_v1 {
    include!(concat!(env!("OUT_DIR"), "/v1.rs"));
}
