//! Remote descriptor lists, for device-side memory views (NIXL's `nixl_remote_dlist_t`).

use super::MemType;
use crate::NixlError;

/// A descriptor of another agent's memory; `remote_agent: None` marks an entry to skip.
#[derive(Debug)]
pub struct RemoteDescriptor<'a> {
    /// Address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Device id.
    pub dev_id: u64,
    /// The agent whose memory it is.
    pub remote_agent: Option<&'a str>,
}

/// A list of remote descriptors of one memory type.
#[derive(Debug)]
pub struct RemoteDescList {
    pub(crate) mem_type: MemType,
    pub(crate) descs: Vec<(u64, u64, u64, Option<String>)>,
}

impl RemoteDescList {
    /// An empty list of `mem_type`.
    pub fn new(mem_type: MemType) -> Result<Self, NixlError> {
        Ok(Self {
            mem_type,
            descs: Vec::new(),
        })
    }

    /// Adds a descriptor (`StringConversionError` for an agent name with a NUL byte).
    pub fn add_desc(&mut self, descriptor: &RemoteDescriptor<'_>) -> Result<(), NixlError> {
        if let Some(name) = descriptor.remote_agent {
            std::ffi::CString::new(name)?;
        }
        self.descs.push((
            descriptor.addr as u64,
            descriptor.len as u64,
            descriptor.dev_id,
            descriptor.remote_agent.map(str::to_owned),
        ));
        Ok(())
    }
}
