//! Names that moved off the crate root keep a `#[deprecated]` alias for one release: code
//! written against the old paths still compiles (with a warning naming the new path) and means
//! the same thing.
#![allow(deprecated)]

use std::sync::Arc;

use nixl_core::backend::BackendPlugin;

#[test]
fn old_root_paths_still_name_the_moved_items() {
    assert_eq!(nixl_core::INPROC, nixl_core::backend::inproc::INPROC);
    assert_eq!(nixl_core::PAGE_SIZE, nixl_core::backend::PAGE_SIZE);
    assert_eq!(
        nixl_core::NOTIF_OVERHEAD,
        nixl_core::backend::NOTIF_OVERHEAD
    );
    assert_eq!(
        nixl_core::ENV_CREDENTIAL,
        nixl_core::access::Credential::ENV
    );
    assert_eq!(nixl_core::access::Credential::ENV, "NIXL_CREDENTIAL");
    // The unit struct's old path works as a value and as a type.
    let p: nixl_core::InprocPlugin = nixl_core::InprocPlugin;
    let p: Arc<dyn BackendPlugin> = Arc::new(p);
    assert_eq!(p.name(), nixl_core::backend::inproc::INPROC);
    // Enums through the old alias: variants still resolve.
    let m: nixl_core::CostMethod = nixl_core::backend::CostMethod::Measured;
    assert!(matches!(m, nixl_core::CostMethod::Measured));
    let plan = nixl_core::FaultPlan::default();
    let _: nixl_core::backend::fault::FaultPlan = plan;
    // The lease, access, completion and telemetry types that left the root (0.1.0 aliases).
    let id: nixl_core::LeaseId = nixl_core::leases::LeaseId(7);
    assert_eq!(id, "7".parse::<nixl_core::leases::LeaseId>().unwrap());
    let policy: nixl_core::FetchPolicy = nixl_core::FetchPolicy::LoadedPeers;
    assert_eq!(policy, nixl_core::access::FetchPolicy::LoadedPeers);
    assert_eq!(
        nixl_core::Credential::ENV,
        nixl_core::access::Credential::ENV
    );
    let _: Option<nixl_core::Notification> = None::<nixl_core::completion::Notification>;
    let _: Option<nixl_core::NotifStream> = None::<nixl_core::completion::NotifStream>;
    let _: Option<nixl_core::TelemetrySnapshot> = None::<nixl_core::telemetry::TelemetrySnapshot>;
}
