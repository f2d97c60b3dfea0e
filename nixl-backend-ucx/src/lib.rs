//! nixl-backend-ucx (skeleton; filled by its issue).
