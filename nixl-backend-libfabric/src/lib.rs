//! nixl-backend-libfabric (skeleton; filled by its issue).
