//! Builder setters for the options, config and params structs.
//!
//! Those structs are `#[non_exhaustive]` (a new field is not a breaking change), so code outside
//! their crate cannot write them as struct literals: it starts from `Default::default()` (or the
//! struct's constructor) and chains one setter per field, each named as its field. A field of
//! type `Option<T>` gets a setter that takes a `T` or an `Option<T>`; the fields stay public, so
//! `opts.timeout = None;` still reads and writes them directly.

/// Generates one `#[must_use]` setter per listed field: `$field(mut self, v) -> Self`.
///
/// ```ignore
/// nixl_core::__setters!(MyParams {
///     rails: usize,
///     stats: Stats,
/// } some {
///     provider: String,
/// });
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __setters {
    ($ty:ty { $($f:ident: $t:ty),* $(,)? } $(some { $($sf:ident: $st:ty),* $(,)? })?) => {
        impl $ty {
            $(
                #[doc = concat!("Sets `", stringify!($f), "` (see the field).")]
                #[must_use]
                pub fn $f(mut self, $f: $t) -> Self {
                    self.$f = $f;
                    self
                }
            )*
            $($(
                #[doc = concat!("Sets `", stringify!($sf), "` (a value or an `Option`; see the field).")]
                #[must_use]
                pub fn $sf(mut self, $sf: impl Into<Option<$st>>) -> Self {
                    self.$sf = $sf.into();
                    self
                }
            )*)?
        }
    };
}

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
