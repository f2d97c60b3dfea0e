//! nixl-sys's lazy synchronisation helper, public in its API: data changed locally is pushed
//! to a backend object once, at its next use. The lists here keep no C object, so they do not
//! use it; it stays for code that does.

use std::cell::Cell;

/// Data that can be pushed to a backend representation.
pub trait BackendSyncable {
    /// The backend representation.
    type Backend;
    /// The error a push may return.
    type Error;

    /// Pushes the data to `backend`.
    fn sync_to_backend(&self, backend: &Self::Backend) -> Result<(), Self::Error>;
}

/// Data with a backend copy that is synchronised on first access after a change.
#[derive(Debug)]
pub struct SyncManager<T: BackendSyncable> {
    data: T,
    backend: T::Backend,
    dirty: Cell<bool>,
}

impl<T: BackendSyncable> SyncManager<T> {
    /// Wraps `data` and its backend copy (dirty until the first access).
    pub fn new(data: T, backend: T::Backend) -> Self {
        Self {
            data,
            backend,
            dirty: Cell::new(true),
        }
    }

    /// The data, for changing it (the backend copy is pushed again at its next access).
    pub fn data_mut(&mut self) -> &mut T {
        self.dirty.set(true);
        &mut self.data
    }

    /// The data.
    pub fn data(&self) -> &T {
        &self.data
    }

    /// The backend copy, pushed first when the data changed since the last push.
    pub fn backend(&self) -> Result<&T::Backend, T::Error> {
        if self.dirty.get() {
            self.data.sync_to_backend(&self.backend)?;
            self.dirty.set(false);
        }
        Ok(&self.backend)
    }
}
