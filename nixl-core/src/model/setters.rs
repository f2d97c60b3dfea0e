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
