//! The impls every backend writes the same way, from its params type.

/// A backend's two registration impls, from its params type: `BackendParams` (the name, and
/// `create` running `$create` with the params `$p` and the `BackendContext` `$ctx`) and the
/// named plugin's `BackendPlugin` (the name, `<$params>::default_map()` and
/// `<$params>::from_map(map)`, which the params type defines: its string-map form).
///
/// ```ignore
/// nixl_core::__backend_plugin!(UcxPlugin, UcxParams, UCX, |p, ctx| UcxBackend::new(p, ctx));
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __backend_plugin {
    ($plugin:ty, $params:ty, $name:expr, |$p:ident, $ctx:ident| $create:expr) => {
        impl $crate::backend::BackendParams for $params {
            fn backend_name(&self) -> &str {
                $name
            }

            fn create(
                self: Box<Self>,
                $ctx: $crate::backend::BackendContext,
            ) -> $crate::Result<std::sync::Arc<dyn $crate::backend::Backend>> {
                let $p = *self;
                Ok(std::sync::Arc::new($create?))
            }
        }

        impl $crate::backend::BackendPlugin for $plugin {
            fn name(&self) -> &str {
                $name
            }

            fn default_params(&self) -> std::collections::BTreeMap<String, String> {
                <$params>::default_map()
            }

            fn parse_params(
                &self,
                params: &std::collections::BTreeMap<String, String>,
            ) -> $crate::Result<Box<dyn $crate::backend::BackendParams>> {
                Ok(Box::new(<$params>::from_map(params)?))
            }
        }
    };
}
